"""What the browser tests share: Debian's headless Chromium driven by Playwright (the modules that import this
skip without either; their `browser` fixture is in conftest.py), an app of a test's own, the page's inputs, and
the check that a text reads against its background."""
import contextlib
import json
import os
import shutil
import time

import pytest

from runtimes import QUIET
from ui import layout
from ui.models import Runtimes
from ui.startup import build_runtime

CHROMIUM = os.environ.get("DECODESCOPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPT = "one two three, one two three, one two three, one two"
VIEWPORT = {"width": 1400, "height": 1000}

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install playwright)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"needs Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)


@contextlib.contextmanager
def app(models):
    """An app of its own over `models` (a Runtimes), served while the block runs; yields its URL."""
    demo = layout.build(models)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    try:
        yield demo.local_url
    finally:
        demo.close()


@contextlib.contextmanager
def page_at(browser, url, viewport=VIEWPORT):
    """A page of its own (a fresh context: a session of the app's own) at `url`."""
    context = browser.new_context(viewport=viewport)
    try:
        page = context.new_page()
        page.goto(url)
        yield page
    finally:
        context.close()


@contextlib.contextmanager
def serving(browser, models):
    """A page on an app of its own over `models`; the app and the page close after."""
    with app(models) as url, page_at(browser, url) as page:
        yield page


def tiny_and(folder, name: str) -> Runtimes:
    """The tiny launch model, and the model in `folder` offered in the picker as `name` (built on its first pick)."""
    def build(shared):
        rt = build_runtime(str(folder), **QUIET, shared=shared)
        rt.model_name = name
        return rt

    return Runtimes(build_runtime(tiny=True, **QUIET), {name: ("reading its weights", build)})


def slowed(rounds_fn, seconds: float):
    """`rounds_fn` (a Runtime's) with a sleep of `seconds` after each round: a run lasts long enough to look at the
    page, or to stop it, meanwhile."""
    def slow(s, ids, *earlier):
        for rnd in rounds_fn(s, ids, *earlier):
            time.sleep(seconds)
            yield rnd

    return slow


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def wait_for_runs(page, n):
    """The run table lists n runs: the run's figures, table and files (last_run) have landed."""
    page.wait_for_function(
        f"(document.querySelector('#runs')?.innerText.match(/ · (eager|graph) · /g) || []).length >= {n}",
        timeout=30_000)


def generate(page, mode="n-gram", max_new_tokens=48, run_no=1):
    """A run of PROMPT as the page's form sends it (chat off), waited for until its figures, table and files land."""
    page.locator("#mode").get_by_label(mode, exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    page.locator("#chat input").uncheck()
    set_number(page, "max-new-tokens", max_new_tokens)
    page.click("#generate-btn")
    page.wait_for_function(f"document.querySelector('#status')?.innerText.includes('Run {run_no} done')",
                           timeout=30_000)
    wait_for_runs(page, run_no)


READABLE = 4.5  # WCAG 2 AA for body text

# Each element's own text against the colour behind it: the backgrounds of it and its ancestors laid over the white
# canvas, its colour over that at the product of the opacities up the tree (exact where the elements with an
# opacity below 1 have no background of their own, as the page's notes and messages).
CONTRAST = """(sel) => {
  const rgba = c => { const v = c.match(/[\\d.]+/g).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const lum = c => c.slice(0, 3).map(v => v / 255).map(v => v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4)
    .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  const own = e => [...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
  return [...document.querySelectorAll(sel)].filter(e => own(e) && e.getClientRects().length).map(e => {
    const chain = [];
    for (let a = e; a; a = a.parentElement) chain.unshift(a);
    let bg = [255, 255, 255, 1], opacity = 1;
    for (const a of chain) {
      bg = over(rgba(getComputedStyle(a).backgroundColor), bg);
      opacity *= parseFloat(getComputedStyle(a).opacity);
    }
    const ink = rgba(getComputedStyle(e).color);
    ink[3] *= opacity;
    const [hi, lo] = [lum(over(ink, bg)), lum(bg)].sort((x, y) => y - x);
    return [own(e).slice(0, 40), Math.round((hi + 0.05) / (lo + 0.05) * 100) / 100];
  });
}"""
# an element whose content is wider than its box (scrolled or cut off)
OVERFLOWING = """(sel) => [...document.querySelectorAll(sel)]
  .filter(e => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent.slice(0, 40))"""


def readable(page, sel: str, want: int = 1) -> list:
    """The texts under `sel`, each checked readable against its background; at least `want` of them. Gradio's own
    progress text ("processing | 0.0/0.1s") fades in over a component that starts an event: read mid-fade it
    measured a ratio of 1 (a CI run, the box loaded), so a low one on it is read again for up to 3 s before it
    counts."""
    for _ in range(30):
        found = page.evaluate(CONTRAST, sel)
        if not any(ratio < READABLE and text.startswith("processing") for text, ratio in found):
            break
        page.wait_for_timeout(100)
    assert len(found) >= want, (sel, found)
    assert all(ratio >= READABLE for _, ratio in found), json.dumps([sel, found], ensure_ascii=False)
    assert not page.evaluate(OVERFLOWING, sel), (sel, page.evaluate(OVERFLOWING, sel))
    return found
