import math

import plotly.graph_objects as go
import pytest

from engine.stats import Stats
from ui import compare, plots
from ui.testing import synthetic_stats

RUNS = {"plain": synthetic_stats(30), "spec": synthetic_stats(30, k=4, seed=3)}


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("builder", [plots.itl_figure, plots.steps_figure, plots.acceptance_figure])
def test_builders_return_serialisable_figures(builder, name):
    fig = builder(RUNS[name])
    assert isinstance(fig, go.Figure)
    assert fig.layout.uirevision  # zoom survives streamed updates
    fig.to_json()


@pytest.mark.parametrize("builder", [plots.itl_figure, plots.steps_figure, plots.acceptance_figure])
def test_builders_handle_a_run_that_has_not_started(builder):
    fig = builder(Stats([], prompt_len=3))
    assert fig.layout.annotations  # a message, not an empty axis


def test_itl_traces_are_per_kind_and_match_stats_latencies():
    s = RUNS["spec"]
    fig = plots.itl_figure(s)
    marker_traces = [t for t in fig.data if t.mode == "markers"]
    assert {t.name for t in marker_traces} <= {"target", "accepted", "resampled", "bonus"}
    got = sorted(y for t in marker_traces for y in t.y)
    assert got == pytest.approx(sorted(s.token_latencies_ms()))
    lines = [sh for sh in fig.layout.shapes]
    assert len(lines) == 2  # p50 and p99


def test_plain_itl_has_no_separate_round_line():
    fig = plots.itl_figure(RUNS["plain"])
    assert [t.name for t in fig.data] == ["target"]


def test_steps_lanes_cover_each_rounds_time():
    s = RUNS["spec"]
    fig = plots.steps_figure(s)
    total = sum(sum(t.x) for t in fig.data)
    assert total == pytest.approx(sum(r.total_ms for r in s.rounds))
    assert {t.name for t in fig.data} == {"draft", "target", "sample", "host"}


def test_acceptance_panels_match_stats():
    s = RUNS["spec"]
    fig = plots.acceptance_figure(s)
    hist, pos, rolling, chosen, accepted = fig.data
    assert {x: y for x, y in zip(hist.x, hist.y, strict=True) if y} == s.accepted_histogram()
    assert list(hist.x) == list(range(5))  # every count 0..k, zeros included
    assert list(pos.y) == pytest.approx(s.per_position_acceptance())
    assert all(0 <= y <= 1 for y in rolling.y)
    assert list(zip(chosen.x, chosen.y, strict=True)) == s.chosen_k()  # the schedule's k per round
    assert list(accepted.y) == [r.n_accepted for r in s.rounds if r.n_drafted]


def test_acceptance_title_names_the_layers_a_calibrated_drafter_skips():
    s = synthetic_stats(12, k=3, seed=1)
    s.rounds[0].draft_info = dict(drafter="layer_skip", draft_layers=28, target_layers=30, layer_set="calibrated",
                                  skipped_layers="13 14", calibrated_acceptance=0.81)
    title = plots.acceptance_figure(s).layout.title.text
    assert "runs 28 of 30 layers, skips 13 14 (calibrated on the prompt; 81% expected acceptance)" in title


def test_a_run_the_schedule_kept_plain_still_shows_its_ks():
    s = synthetic_stats(6)
    for r in s.rounds[1:]:
        r.k = 0
    fig = plots.acceptance_figure(s)
    assert not fig.layout.annotations or "pick a speculative mode" not in fig.layout.annotations[0].text
    assert list(fig.data[3].y) == [0] * 5


def test_acceptance_for_plain_run_says_why_it_is_empty():
    fig = plots.acceptance_figure(RUNS["plain"])
    assert "speculative" in fig.layout.annotations[0].text


def test_compare_figure_speedups_and_reasons():
    plain, spec = RUNS["plain"], RUNS["spec"]
    configs = [("speculative", "plain", "p", None, True), ("speculative", "n-gram k=4", "s", None, False),
               ("CUDA graphs", "eager", None, "needs a CUDA device", True),
               ("CUDA graphs", "graph", None, "needs a CUDA device", False)]
    entries = compare.entries(configs, {"p": plain, "s": spec})
    want = spec.summary()["decode_tok_s"] / plain.summary()["decode_tok_s"]
    assert [e.speedup for e in entries] == [None, pytest.approx(want), None, None]
    assert spec.baseline_tok_s is None  # the run itself is left as it was
    fig = plots.compare_figure(entries)
    assert fig.data[0].text[1] == f"×{want:.2f}"
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "CUDA graphs / eager: needs a CUDA device" in notes
    rows = plots.compare_rows(entries)
    assert rows[2][-1] == "needs a CUDA device" and rows[1][5] == pytest.approx(want, rel=1e-3)
    assert len(plots.COMPARE_HEADERS) == len(rows[0])
    fig.to_json()


def test_compare_with_nothing_run_lists_reasons():
    fig = plots.compare_figure([plots.CompareEntry("CUDA graphs", "graph", reason="needs a CUDA device")])
    assert "needs a CUDA device" in fig.layout.annotations[0].text


def test_rolling_acceptance_window():
    xs, ys = plots.rolling_acceptance(RUNS["spec"], window=1)
    spec = [r for r in RUNS["spec"].rounds if r.n_drafted]
    assert ys == [r.n_accepted / r.n_drafted for r in spec]
    assert not math.isnan(sum(ys))
