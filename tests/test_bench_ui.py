"""bench.ui's report (the benchmark itself needs Chromium and minutes: `python -m bench.ui`; its cores:
test_bench_cores.py)."""
from bench.ui import report


def result(**over) -> dict:
    row = dict(mode="plain", tokens=64, headless_tok_s=100.0, browser_tok_s=90.0, ratio=0.9, chromium_cores=0.3,
               latency_p50_ms=40.0, latency_p95_ms=80.0, latency_max_ms=120.0, spans_timed=64)
    rows = [dict(row, setup="shared", torch_threads=2, engine_cores="0 1", browser_cores="0 1"),
            dict(row, setup="pinned", torch_threads=1, engine_cores="0", browser_cores="1", browser_tok_s=99.0)]
    return dict(model="tiny", device="cpu", repeats=1, rows=rows, pin=dict(engine=[0], browser=[1]),
                pin_skipped=None, load_avg_before=(0.5, 0, 0), load_avg_after=(1.0, 0, 0)) | over


def test_the_report_says_what_each_row_is_and_where_each_side_ran():
    md = report(result())
    assert "*shared*: the page's Chromium and the engine on the same cores" in md
    assert "*pinned*: the engine (this process, every thread, the headless runs included) on cores 0 with 1" in md
    assert "Chromium on 1," in md
    assert "| shared | plain | 64 | 2 | 0 1 | 0 1 |" in md and "| pinned | plain | 64 | 1 | 0 | 1 |" in md


def test_a_pin_the_machine_cannot_make_is_reported_with_its_reason():
    shared_only = result(pin=None, pin_skipped="pinning needs at least 2")
    shared_only["rows"] = shared_only["rows"][:1]
    md = report(shared_only)
    assert "*pinned*: not measured, pinning needs at least 2." in md and "| pinned |" not in md
    assert "not measured in this run (`--pin`)" in report(result(pin=None))
