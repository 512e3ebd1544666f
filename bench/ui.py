"""What the browser costs: engine tok/s while a run streams to a real page vs the same run headless, and the
latency from a round leaving the engine to its spans being on screen.

    python -m bench.ui                       # embedded default model, plain and n-gram, 256 tokens
    python -m bench.ui --pin                 # and again with the engine and the browser on cores of their own
    python -m bench.ui --pin --name ui-default-cpu-zen4   # a CPU kind's own results file
    python -m bench.ui --tiny --tokens 128   # smoke run on the random-weight model

The app is served in-process and driven by headless Chromium (Playwright, Debian's /usr/bin/chromium).
Each repeat runs the page first, then the exact same settings and prompt headless (the engine's own
stream, no server, no page), so both see the same tokens. Latency: the engine side stamps each round
as the engine yields it; the page stamps the first animation frame after the round's spans entered the
DOM (performance.timeOrigin + performance.now(), the same wall clock). Goals: >= 95 % of headless tok/s,
p95 latency < 100 ms.

With --pin, the same measurement is made a second time with the browser pinned away from the engine's cores
(bench/cores.py; on 2 cores: the engine on core 0 with 1 thread, the headless runs too, Chromium on core 1): a
Space's page is drawn on the visitor's machine, so what the engine itself pays to stream is known apart from
the browser's drawing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from bench import cores
from bench.cores import ChromiumCPU
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


class Recorder:
    """Wraps the runtime's round source: keeps each run's settings, rounds and wall-clock stamps."""

    def __init__(self, rounds_fn):
        self.rounds_fn, self.runs = rounds_fn, []

    def __call__(self, s, ids, earlier=None):
        run = dict(settings=s, ids=ids, rounds=[], stamps=[])
        self.runs.append(run)
        # the tab's earlier answers are left out, as the headless run has none: both runs do the same engine work
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
    used = chromium.cores(run["stamps"][0], run["stamps"][-1]) if chromium and run["stamps"] else float("nan")
    return tok_s, lat, run, used


def held(pin: cores.Split) -> None:
    """Every thread of both sides is on its own cores, or the pinned figures would not be what they say."""
    cores.keep(cores.descendants(os.getpid()), pin.browser)
    engine, browser = cores.ran_on([os.getpid()]), cores.ran_on(cores.descendants(os.getpid()))
    if engine != sorted(pin.engine) or not set(browser) <= pin.browser:
        raise RuntimeError(f"the pin did not hold: the engine's threads may run on cores {engine}, the browser's "
                           f"on {browser}; asked {sorted(pin.engine)} and {sorted(pin.browser)}")


def measure(p, url: str, rt, rec: Recorder, args, pin: cores.Split | None) -> list[dict]:
    """One row per mode: page runs against headless runs of the same settings, with the cores shared or split.

    Pinned, this process (every thread: engine, pump, server, the headless runs too) goes on the engine's cores with
    as many torch threads, and the browser, started afterwards, on the browser's (kept there: ChromiumCPU)."""
    threads = len(pin.engine) if pin else torch.get_num_threads()
    if pin:
        cores.pin(os.getpid(), set(pin.engine))
        torch.set_num_threads(threads)
        # Playwright's driver: the browser it starts next is born on its cores (pinning Chromium after its start
        # races the processes it forks meanwhile)
        for pid in cores.descendants(os.getpid()):
            cores.pin(pid, set(pin.browser))
    browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
    rows = []
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#generate-btn")
        if pin:
            held(pin)
        setup = dict(setup="pinned" if pin else "shared", torch_threads=threads,
                     engine_cores=" ".join(map(str, cores.ran_on([os.getpid()]))),
                     browser_cores=" ".join(map(str, cores.ran_on(cores.descendants(os.getpid())))))
        runs = 0  # the page's own count: each pass has a page (a session) of its own
        with ChromiumCPU(on=pin.browser if pin else None) as chromium:  # its sampling off the engine's cores
            for mode in args.modes:
                runs += 1
                browser_run(page, rt, rec, mode, min(32, args.tokens), runs)  # warm-up: first-call costs
                b_tok, h_tok, lats, n_rounds, used = [], [], [], 0, []
                for i in range(args.repeats):
                    # alternate which goes first, so drift in the machine's load falls on both sides
                    if i % 2:
                        h_tok.append(headless(rt, rec, rec.runs[-1]["settings"], rec.runs[-1]["ids"]))
                    runs += 1
                    tok_s, lat, run, c = browser_run(page, rt, rec, mode, args.tokens, runs, chromium)
                    b_tok.append(tok_s)
                    used.append(c)
                    lats += lat
                    n_rounds = len(run["rounds"])
                    if not i % 2:
                        h_tok.append(headless(rt, rec, run["settings"], run["ids"]))
                    print(f"{setup['setup']} {mode}: page {tok_s:.1f} tok/s, headless {h_tok[-1]:.1f} tok/s, "
                          f"p95 {percentile(lat, 95):.1f} ms, Chromium {c:.2f} cores", flush=True)
                b, h = statistics.median(b_tok), statistics.median(h_tok)
                rows.append(dict(
                    **setup, mode=mode, tokens=args.tokens, rounds=n_rounds, headless_tok_s=round(h, 2),
                    browser_tok_s=round(b, 2), ratio=round(b / h, 4), latency_p50_ms=round(percentile(lats, 50), 1),
                    latency_p95_ms=round(percentile(lats, 95), 1), latency_max_ms=round(max(lats), 1),
                    spans_timed=len(lats), chromium_cores=round(statistics.median(used), 3),
                    ratio_goal_met=b / h >= GOAL_RATIO,
                    latency_goal_met=percentile(lats, 95) < GOAL_P95_MS,
                ))
        if pin:
            for row in rows:  # the browser's threads brought back to its cores while the pass ran (ChromiumCPU)
                row["browser_threads_moved"] = chromium.moved
            held(pin)  # the engine's threads stayed on theirs
    finally:
        browser.close()
    return rows


def bench(args) -> dict:
    from playwright.sync_api import sync_playwright

    load_before = os.getloadavg()
    all_cores, shared_threads = os.sched_getaffinity(0), torch.get_num_threads()
    pin = cores.split(all_cores) if args.pin else None
    if isinstance(pin, str):
        print(f"--pin skipped: {pin}", flush=True)
    rt = build_runtime("default", device=args.device, tiny=args.tiny, bandwidth=False)
    rt.plot_interval_s = args.plot_interval or rt.plot_interval_s
    rt.stream_interval_s = args.stream_interval or rt.stream_interval_s
    rec = Recorder(rt.rounds_fn)
    rt.rounds_fn = rec
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    try:
        with sync_playwright() as p:
            rows = measure(p, demo.local_url, rt, rec, args, None)
            if isinstance(pin, cores.Split):
                try:
                    rows += measure(p, demo.local_url, rt, rec, args, pin)
                finally:
                    cores.pin(os.getpid(), all_cores)
                    torch.set_num_threads(shared_threads)
    finally:
        demo.close()
        rt.close()
    return dict(model="tiny" if args.tiny else "default", device=args.device, repeats=args.repeats,
                plot_interval_s=rt.plot_interval_s, stream_interval_s=rt.stream_interval_s,
                torch_threads=shared_threads, cores=sorted(all_cores),
                pin=dict(engine=sorted(pin.engine), browser=sorted(pin.browser)) if isinstance(pin, cores.Split)
                else None, pin_skipped=pin if isinstance(pin, str) else None,
                prompt=PROMPT, goals=dict(ratio=GOAL_RATIO, latency_p95_ms=GOAL_P95_MS), rows=rows,
                load_avg_before=load_before, load_avg_after=os.getloadavg(),  # other work on the machine
                env=rt.env)


def report(result: dict) -> str:
    cols = ["setup", "mode", "tokens", "torch_threads", "engine_cores", "browser_cores", "headless_tok_s",
            "browser_tok_s", "ratio", "chromium_cores", "latency_p50_ms", "latency_p95_ms", "latency_max_ms",
            "spans_timed"]
    pin = result.get("pin")
    if pin:
        pinned = (f"*pinned*: the engine (this process, every thread, the headless runs included) on cores "
                  f"{' '.join(map(str, pin['engine']))} with {len(pin['engine'])} torch thread(s), Chromium on "
                  f"{' '.join(map(str, pin['browser']))}, as when a Space's page is drawn on the visitor's machine: "
                  f"what streaming costs the engine itself (serializing and sending the updates), apart from the "
                  f"browser's drawing.")
    elif result.get("pin_skipped"):
        pinned = f"*pinned*: not measured, {result['pin_skipped']}."
    else:
        pinned = "*pinned*: not measured in this run (`--pin`)."
    head = (f"# UI streaming cost ({result['model']} model, {result['device']})\n\n"
            f"Median of {result['repeats']} page runs and as many headless runs of the same settings. "
            f"Goals: ratio >= {GOAL_RATIO}, p95 latency < {GOAL_P95_MS:.0f} ms. Rows: *shared*: the page's Chromium "
            f"and the engine on the same cores, as when the app and its page run on one machine; {pinned} "
            f"chromium_cores: Chromium's CPU seconds per second while the engine decoded, all its processes, from "
            f"/proc; engine_cores / browser_cores: where each side's threads were allowed to run. 1-minute load "
            f"average {result['load_avg_before'][0]:.1f} before, {result['load_avg_after'][0]:.1f} after.\n\n")
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
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the engine (shared rows)")
    p.add_argument("--pin", action="store_true",
                   help="also measure with the engine and the browser on cores of their own (skipped, with the "
                        "reason recorded, on fewer than 2 cores)")
    p.add_argument("--stream-interval", type=float, default=None,
                   help="seconds between token updates (default: the app's own)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", help="the results' file name (default ui-<model>-<device>; one per CPU kind)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with Telemetry(args.device) as tel:
        result = bench(args)
    result["provenance"] = provenance(args.device, tel)
    md = report(result)
    print(md)
    write_results(args.out, args.name or f"ui-{result['model']}-{args.device}", result, md)


if __name__ == "__main__":
    main()
