"""What the browser costs: engine tok/s while a run streams to a real page vs the same run headless, and the
latency from a round leaving the engine to its spans being on screen.

    python -m bench.ui                       # embedded default model, plain and n-gram, 256 tokens
    python -m bench.ui --tiny --tokens 128   # smoke run on the random-weight model

The app is served in-process and driven by headless Chromium (Playwright, Debian's /usr/bin/chromium).
Each repeat runs the page first, then the exact same settings and prompt headless (the engine's own
stream, no server, no page), so both see the same tokens. Latency: the engine side stamps each round
as the engine yields it; the page stamps the first animation frame after the round's spans entered the
DOM (performance.timeOrigin + performance.now(), the same wall clock). Goals: >= 95 % of headless tok/s,
p95 latency < 100 ms.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from bench.common import Telemetry, markdown_table, provenance, write_results
from engine.stats import percentile
from engine.stats import Round
from ui import layout
from ui.pump import RoundPump
from ui.models import Runtimes
from ui.startup import build_runtime

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPT = ("Write a detailed, friendly explanation of how a lighthouse works, covering the lamp, the lens, "
          "the clockwork that turns it, and the keeper's daily routine.")
GOAL_RATIO, GOAL_P95_MS = 0.95, 100.0
SETTLE_MS = 1000

# Stamps each span's round the first frame after it appears; spans present before the click are ignored.
OBSERVER_JS = """
() => {
  const root = document.getElementById('output-tokens');
  root.querySelectorAll('span[data-r]').forEach(el => el.dataset.old = '1');
  window.__seen = {};
  if (window.__observer) return;
  window.__observer = new MutationObserver(() => {
    const fresh = [];
    root.querySelectorAll('span[data-r]:not([data-old])').forEach(el => {
      if (!(el.dataset.r in window.__seen) && !fresh.includes(el.dataset.r)) fresh.push(el.dataset.r);
    });
    if (fresh.length) requestAnimationFrame(() => {
      const t = performance.timeOrigin + performance.now();
      fresh.forEach(r => { if (!(r in window.__seen)) window.__seen[r] = t; });
    });
  });
  window.__observer.observe(root, {childList: true, subtree: true});
}
"""


class ChromiumCPU:
    """Samples the CPU time of every Chromium process (/proc, utime + stime) every 20 ms on its own thread, so
    the browser's share of the cores over any stretch of a run can be read afterwards (cores())."""

    def __init__(self, interval_s: float = 0.02):
        self.samples: list[tuple[float, float]] = []  # (time.time() * 1e3, CPU seconds of all Chromium processes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _cpu_s(self) -> float:
        total = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if "chrom" not in Path(f"/proc/{pid}/comm").read_text():
                    continue
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):  # the process ended between listing and reading
                continue
        return total / self._tick

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.samples.append((time.time() * 1e3, self._cpu_s()))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def cores(self, t0_ms: float, t1_ms: float) -> float:
        """Chromium's CPU seconds per second between two wall-clock stamps (the nearest samples inside)."""
        inside = [s for s in self.samples if t0_ms <= s[0] <= t1_ms]
        if len(inside) < 2:
            return float("nan")
        (a_t, a_c), (b_t, b_c) = inside[0], inside[-1]
        return (b_c - a_c) / ((b_t - a_t) / 1e3)


class Recorder:
    """Wraps the runtime's round source: keeps each run's settings, rounds and wall-clock stamps."""

    def __init__(self, rounds_fn):
        self.rounds_fn, self.runs = rounds_fn, []

    def __call__(self, s, ids):
        run = dict(settings=s, ids=ids, rounds=[], stamps=[])
        self.runs.append(run)
        for item in self.rounds_fn(s, ids):  # Round events, and the RunFacts around them
            if isinstance(item, Round):
                run["stamps"].append(time.time() * 1e3)
                run["rounds"].append(item)
            yield item


def headless(rt, rec: Recorder, s, ids) -> float:
    """The same run through the same pump thread the page uses, with no server or page attached.

    (Not from the main thread: on a loaded 2-core machine a 2-thread OpenMP team there ran the tiny model
    up to 50x slower than the same code in a worker thread, which would flatter the page.)"""
    pump = RoundPump(rt, s, ids, threading.Event())
    rounds = [r for batch in pump.batches(1.0) for r in batch]
    return rt.stats(rounds, len(ids), {}).summary()["decode_tok_s"]


def browser_run(page, rt, rec: Recorder, mode: str, tokens: int, run_no: int,
                chromium: ChromiumCPU | None = None) -> tuple[float, list[float], dict, float]:
    page.locator("#mode").get_by_label(mode, exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(tokens))
    box.press("Enter")
    page.evaluate(OBSERVER_JS)
    n_before = len(rec.runs)
    page.click("#generate-btn")
    # polled every 100 ms, not every animation frame (Playwright's default): a check each frame, innerText's
    # layout included, would be the harness's own load on the cores the run is measured on
    page.wait_for_function(f"document.querySelector('#status')?.innerText.includes('Run {run_no} done')",
                           polling=100, timeout=600_000)
    # let the page finish drawing the final figures before anything else is timed
    page.wait_for_selector("#plot-itl .js-plotly-plot .main-svg")
    page.wait_for_timeout(SETTLE_MS)
    run = rec.runs[n_before]
    seen = page.evaluate("window.__seen")
    lat = [seen[str(r.index)] - t for r, t in zip(run["rounds"], run["stamps"], strict=True) if str(r.index) in seen]
    tok_s = rt.stats(run["rounds"], len(run["ids"]), {}).summary()["decode_tok_s"]
    # the browser's share of the cores from the first round to the last (the engine's decode, as tok/s counts it)
    cores = chromium.cores(run["stamps"][0], run["stamps"][-1]) if chromium and run["stamps"] else float("nan")
    return tok_s, lat, run, cores


def bench(args) -> dict:
    from playwright.sync_api import sync_playwright

    load_before = os.getloadavg()
    rt = build_runtime("default", device=args.device, tiny=args.tiny, bandwidth=False)
    rt.plot_interval_s = args.plot_interval or rt.plot_interval_s
    rt.stream_interval_s = args.stream_interval or rt.stream_interval_s
    rec = Recorder(rt.rounds_fn)
    rt.rounds_fn = rec
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    rows = []
    try:
        with sync_playwright() as p, ChromiumCPU() as chromium:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(demo.local_url)
            page.wait_for_selector("#generate-btn")
            runs = 0
            for mode in args.modes:
                runs += 1
                browser_run(page, rt, rec, mode, min(32, args.tokens), runs)  # warm-up: first-call costs
                b_tok, h_tok, lats, n_rounds, cores = [], [], [], 0, []
                for i in range(args.repeats):
                    # alternate which goes first, so drift in the machine's load falls on both sides
                    if i % 2:
                        h_tok.append(headless(rt, rec, rec.runs[-1]["settings"], rec.runs[-1]["ids"]))
                    runs += 1
                    tok_s, lat, run, c = browser_run(page, rt, rec, mode, args.tokens, runs, chromium)
                    b_tok.append(tok_s)
                    cores.append(c)
                    lats += lat
                    n_rounds = len(run["rounds"])
                    if not i % 2:
                        h_tok.append(headless(rt, rec, run["settings"], run["ids"]))
                    print(f"{mode}: page {tok_s:.1f} tok/s, headless {h_tok[-1]:.1f} tok/s, "
                          f"p95 {percentile(lat, 95):.1f} ms, Chromium {c:.2f} cores", flush=True)
                b, h = statistics.median(b_tok), statistics.median(h_tok)
                rows.append(dict(
                    mode=mode, tokens=args.tokens, rounds=n_rounds, headless_tok_s=round(h, 2),
                    browser_tok_s=round(b, 2), ratio=round(b / h, 4), latency_p50_ms=round(percentile(lats, 50), 1),
                    latency_p95_ms=round(percentile(lats, 95), 1), latency_max_ms=round(max(lats), 1),
                    spans_timed=len(lats), chromium_cores=round(statistics.median(cores), 3),
                    ratio_goal_met=b / h >= GOAL_RATIO,
                    latency_goal_met=percentile(lats, 95) < GOAL_P95_MS,
                ))
            browser.close()
    finally:
        demo.close()
        rt.close()
    return dict(model="tiny" if args.tiny else "default", device=args.device, repeats=args.repeats,
                plot_interval_s=rt.plot_interval_s, stream_interval_s=rt.stream_interval_s,
                torch_threads=torch.get_num_threads(),
                prompt=PROMPT, goals=dict(ratio=GOAL_RATIO, latency_p95_ms=GOAL_P95_MS), rows=rows,
                load_avg_before=load_before, load_avg_after=os.getloadavg(),  # other work on the machine
                env=rt.env)


def report(result: dict) -> str:
    cols = ["mode", "tokens", "headless_tok_s", "browser_tok_s", "ratio", "chromium_cores", "latency_p50_ms",
            "latency_p95_ms", "latency_max_ms", "spans_timed"]
    head = (f"# UI streaming cost ({result['model']} model, {result['device']})\n\n"
            f"Median of {result['repeats']} page runs and as many headless runs of the same settings. "
            f"Goals: ratio >= {GOAL_RATIO}, p95 latency < {GOAL_P95_MS:.0f} ms. The page and the engine share "
            f"this machine (chromium_cores: Chromium's CPU seconds per second while the engine decoded, all its "
            f"processes, from /proc); 1-minute load average {result['load_avg_before'][0]:.1f} before, "
            f"{result['load_avg_after'][0]:.1f} after.\n\n")
    return head + markdown_table(result["rows"], cols)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="random-weight tiny model instead of the default")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["plain", "n-gram"])
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--plot-interval", type=float, default=None,
                   help="seconds between live figure refreshes (default: the app's own)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the engine")
    p.add_argument("--stream-interval", type=float, default=None,
                   help="seconds between token updates (default: the app's own)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with Telemetry(args.device) as tel:
        result = bench(args)
    result["provenance"] = provenance(args.device, tel)
    md = report(result)
    print(md)
    write_results(args.out, f"ui-{result['model']}-{args.device}", result, md)


if __name__ == "__main__":
    main()
