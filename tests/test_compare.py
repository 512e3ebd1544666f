"""Compare (ui/compare.py) called directly on the tiny random-weight engine: the runs it plans and what this
machine cannot run among them, each named with its reason, the speedups it writes into the runs CSV, and a refused
Compare's status line."""
import gradio as gr
import pytest

from test_callbacks import PROMPT, read_csv, values
from ui import backends, compare
from ui.models import Runtimes
from ui.run import Session, parse_settings


def test_compare_lists_what_this_machine_cannot_run(tiny_runtime):
    session = Session()
    statuses = list(compare.compare(Runtimes(tiny_runtime), session, PROMPT, **values(mode="n-gram")))
    s, ids = backends.prepare(tiny_runtime, PROMPT, values(mode="n-gram"))
    planned = compare.plan(tiny_runtime, s, len(ids) + s.max_new_tokens)
    ran = len({cfg for _, _, cfg, _, _ in planned if cfg is not None})  # a run two groups share runs once
    assert all(isinstance(x, str) for x in statuses) and f"Compared {ran} runs" in statuses[-1]
    fig, rows, table, runs_csv = compare.last_compare(tiny_runtime, session)
    by_label = {(r[0], r[1]): r for r in rows}
    assert by_label[("CUDA graphs", "CUDA graph")][-1] == tiny_runtime.graphs_reason
    if tiny_runtime.fused_reason:
        assert by_label[("kernels", "fused kernels")][-1] == tiny_runtime.fused_reason
    assert by_label[("speculative", "plain")][2] > 0 and by_label[("speculative", "n-gram n=3 k≤4")][5].startswith("×")
    assert by_label[("weights", "fp32 weights")][-1].endswith("baseline")
    assert by_label[("weights", "q4 weights")][5].startswith("×")
    assert by_label[("attention", "window 512 + 4 sinks")][-1].startswith("same as full attention at this context")
    assert len(session.history) == ran and len(read_csv(runs_csv)) == ran and len(table) == ran
    fig.to_json()


def test_a_window_the_context_never_reaches_is_named_not_timed(tiny_runtime):
    s = parse_settings(values())
    attention = [p for p in compare.plan(tiny_runtime, s, 260) if p[0] == "attention"]
    assert attention == [("attention", "window 512 + 4 sinks", None,
                          "same as full attention at this context (260 positions fit in the window)", False)]
    assert [p[1] for p in compare.plan(tiny_runtime, s, 600) if p[0] == "attention"] == ["full", "window 512 + 4 sinks"]


def test_compare_runs_carry_their_speedup_into_the_runs_csv(tiny_runtime):
    import pandas as pd

    session = Session()
    list(compare.compare(Runtimes(tiny_runtime), session, PROMPT, **values(mode="n-gram")))
    *_, runs_csv = compare.last_compare(tiny_runtime, session)
    df = pd.read_csv(runs_csv).set_index("label")
    spec = df.loc["compare: n-gram n=3 k≤4 · eager · torch · fp32"]
    assert spec["speedup"] > 0 and spec["speedup_over"] == "plain"
    assert df["prompt_tokens"].notna().all()
    compared = df[df["speedup"].notna()]
    assert len(compared) == len(df) - 1  # every run but the plain fp32 one (a baseline in every group)


def test_a_refused_compare_says_why_in_the_status_line(tiny_runtime):
    session = Session()
    gen = compare.compare(Runtimes(tiny_runtime), session, PROMPT, **values(mode="n-gram", k=40))
    assert "k=40" in next(gen)
    with pytest.raises(gr.Error):
        next(gen)
