"""Screenshot the app after a real run: the default model, Generate on the prompt the page opens with (the
quote-and-edit example, n-gram), then Compare. Writes docs/screenshot.png; the figures in it are whatever
this machine measured.

    python scripts/screenshot.py [--out docs/screenshot.png] [--chromium /usr/bin/chromium]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from ui import layout
from ui.models import Runtimes
from ui.startup import build_runtime

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "screenshot.png"))
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--tokens", type=int, default=96)
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    rt = build_runtime(device="cpu")
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(demo.local_url)
            page.wait_for_selector("#generate-btn")
            box = page.locator("#max-new-tokens input[type=number]")
            box.fill(str(args.tokens))
            box.press("Enter")
            page.click("#generate-btn")
            page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 1 done')",
                                   timeout=300_000)
            page.click("#compare-btn")
            page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compared')",
                                   timeout=600_000)
            page.wait_for_selector("#plot-compare .js-plotly-plot .main-svg", timeout=30_000)
            page.wait_for_timeout(1500)
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    finally:
        demo.close()
        rt.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
