import math

import plotly.graph_objects as go
import pytest

from engine.stats import Stats
from ui import compare, compare_plots, plots
from engine.request import Request
from ui.testing import synthetic_stats

RUNS = {"plain": synthetic_stats(30), "spec": synthetic_stats(30, k=4, seed=3)}


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("builder", [plots.itl_figure, plots.steps_figure, plots.acceptance_figure])
def test_builders_return_serialisable_figures(builder, name):
    fig = builder(RUNS[name])
    assert isinstance(fig, go.Figure)
    assert fig.layout.uirevision  # zoom survives streamed updates
    # the page's own colour shows through, light or dark (style.py recolours the ink in dark mode)
    assert fig.layout.paper_bgcolor == fig.layout.plot_bgcolor == "rgba(0,0,0,0)"
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
    summary = s.summary()
    lines = {t.name.split()[0]: t for t in fig.data if t.name.startswith("p")}
    assert set(lines) == {"p50", "p99"}  # named in the legend, not written beside the axis
    assert lines["p50"].y[0] == pytest.approx(summary["itl_p50_ms"])
    assert lines["p99"].y[0] == pytest.approx(summary["itl_p99_ms"])
    assert not fig.layout.annotations


def test_plain_itl_has_no_separate_round_line():
    fig = plots.itl_figure(RUNS["plain"])
    assert [t.name for t in fig.data if not t.name.startswith("p")] == ["target"]


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


def test_acceptance_subtitle_names_the_layers_a_calibrated_drafter_skips():
    s = synthetic_stats(12, k=3, seed=1)
    s.rounds[0].draft_info = dict(drafter="layer_skip", draft_layers=28, target_layers=30, layer_set="calibrated",
                                  skipped_layers="13 14", calibrated_acceptance=0.81)
    title = plots.acceptance_figure(s).layout.title
    want = "runs 28 of 30 layers, skips 13 14 (calibrated on the prompt; 81% expected acceptance)"
    assert want in title.subtitle.text
    assert title.subtitle.font.size >= 12  # a subtitle, not a footnote


def plain_steps_only(n=8, mode="layer-skip", adaptive=True):
    """A speculative run whose schedule made every round a plain step."""
    s = synthetic_stats(n, mode=mode, adaptive=adaptive)
    for r in s.rounds[1:]:
        r.k = 0
    return s


def test_a_run_the_schedule_kept_plain_says_so_and_why():
    s = plain_steps_only()
    s.rounds[0].draft_info = dict(drafter="layer_skip", draft_layers=28, target_layers=30, layer_set="calibrated",
                                  skipped_layers="13 14", calibrated_acceptance=0.62)
    fig = plots.acceptance_figure(s)
    assert not fig.data  # no empty axes
    text = fig.layout.annotations[0].text.replace("<br>", " ")
    assert "Drafted in 0 of 7 rounds" in text and "beats a plain step by 5%" in text
    assert "expected 62% acceptance" in text and "28 of 30 layers" in text


def test_fixed_k_plain_steps_are_rounds_without_a_proposal():
    fig = plots.acceptance_figure(plain_steps_only(mode="n-gram", adaptive=False))
    assert "had none" in fig.layout.annotations[0].text.replace("<br>", " ")


def test_acceptance_for_plain_run_says_why_it_is_empty():
    fig = plots.acceptance_figure(RUNS["plain"])
    assert "speculative" in fig.layout.annotations[0].text


def compare_entries():
    plain, spec = Request(mode="plain"), Request(mode="n-gram", k=4)
    configs = [("speculative", "plain", plain, None, True), ("speculative", "n-gram k=4", spec, None, False),
               ("CUDA graphs", "eager", None, "needs a CUDA device", True),
               ("CUDA graphs", "graph", None, "needs a CUDA device", False)]
    return compare.entries(configs, {plain: RUNS["plain"], spec: RUNS["spec"]})


def test_compare_figure_speedups_and_reasons():
    plain, spec = RUNS["plain"], RUNS["spec"]
    entries = compare_entries()
    want = spec.summary()["decode_tok_s"] / plain.summary()["decode_tok_s"]
    assert [e.speedup for e in entries] == [None, pytest.approx(want), None, None]
    assert entries[1].baseline_label == "plain"
    assert spec.baseline_tok_s is None  # the run itself is left as it was
    fig = compare_plots.compare_figure(entries)
    texts = [t for trace in fig.data if trace.type == "bar" for t in trace.text]
    assert any(f"×{want:.2f}" in t for t in texts)
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "CUDA graphs: eager: needs a CUDA device" in notes
    rows = compare_plots.compare_rows(entries)
    assert rows[2][-1] == "needs a CUDA device" and rows[1][5] == f"×{want:.2f}"  # as the bar says it
    assert rows[1][6] == "plain"
    assert len(compare_plots.COMPARE_HEADERS) == len(rows[0])
    fig.to_json()


def test_compare_figure_answers_which_is_fastest():
    entries = compare_entries()
    best = max((e for e in entries if e.stats), key=lambda e: e.tok_s)
    fig = compare_plots.compare_figure(entries)
    assert f"fastest here: {best.run}" in fig.layout.title.subtitle.text
    marked = [t for trace in fig.data if trace.type == "bar" for t in trace.text if t.endswith("★")]
    assert len(marked) == 1
    assert [r[-1] for r in compare_plots.compare_rows(entries)].count("fastest" if not best.baseline else
                                                                       "fastest, baseline") == 1
    assert {t.name for t in fig.data if t.type == "bar"} == {"baseline", "compared"}  # a legend says which is which
    assert all(fig.layout[ax].type == "log" for ax in ("xaxis", "xaxis2"))  # a slow reference row stays readable


def test_compare_rows_are_per_token_not_per_round():
    """A speculative round emits several tokens: its time per token is what compares with a plain step."""
    entries = compare_entries()
    spec = entries[1]
    assert spec.token_ms(50) == pytest.approx(spec.stats.summary()["itl_p50_ms"])
    assert compare_plots.compare_rows(entries)[1][3] == pytest.approx(spec.stats.summary()["itl_p50_ms"], rel=1e-3)


def test_compare_with_nothing_run_lists_reasons():
    fig = compare_plots.compare_figure([compare_plots.CompareEntry("CUDA graphs", "graph",
                                                                   reason="needs a CUDA device")])
    assert "needs a CUDA device" in fig.layout.annotations[0].text


def test_rolling_acceptance_window():
    xs, ys = plots.rolling_acceptance(RUNS["spec"], window=1)
    spec = [r for r in RUNS["spec"].rounds if r.n_drafted]
    assert ys == [r.n_accepted / r.n_drafted for r in spec]
    assert not math.isnan(sum(ys))


def calibrated_run(n=12):
    s = synthetic_stats(n, k=3, seed=1, mode="layer-skip")
    s.rounds[0].draft_info = dict(drafter="layer_skip", draft_layers=28, target_layers=30, layer_set="calibrated",
                                  skipped_layers="13 14", calibrated_acceptance=0.81)
    s.rounds[0].draft_ms = 900.0  # the calibration, inside round 0
    s.rounds[0].t_end_ms += 900.0
    return s


def test_calibration_is_its_own_lane_never_a_draft():
    s = calibrated_run()
    fig = plots.steps_figure(s)
    lanes = {t.name: t for t in fig.data}
    assert list(lanes["calibration"].x) == [900.0] and [c[0] for c in lanes["calibration"].customdata] == [0]
    assert 0 not in [c[0] for c in lanes["draft"].customdata]
    assert "calibration" in fig.layout.yaxis.categoryarray
    assert "900 ms of it the drafter's calibration" in plots.itl_figure(s).layout.title.text
    # a plain run has no setup lane
    assert "calibration" not in {t.name for t in plots.steps_figure(RUNS["plain"]).data}
    # over a short prompt the calibration's forward is the target's prefill too, and the lane says so
    s.rounds[0].draft_info["calibration_prefilled"] = True
    assert "calibration and prefill" in {t.name for t in plots.steps_figure(s).data}
    assert "900 ms of it the drafter's calibration and prefill" in plots.itl_figure(s).layout.title.text


def test_rolling_acceptance_breaks_where_no_round_drafted():
    """Two drafting rounds 65 rounds apart are two points, not a line across rounds that drafted nothing."""
    xs, ys = plots.with_gaps([1, 2, 3, 68], [0.0, 0.5, 0.25, 0.5])
    assert xs == [1, 2, 3, None, 68] and ys == [0.0, 0.5, 0.25, None, 0.5]
    s = synthetic_stats(70, k=4, seed=3)
    for r in s.rounds[2:68]:
        r.n_drafted, r.k = 0, 0
    rolling = plots.acceptance_figure(s).data[2]
    assert None in rolling.x and "markers" in rolling.mode and not rolling.connectgaps


def test_a_count_axis_has_whole_number_ticks():
    s = synthetic_stats(4, k=4, seed=3)  # three decode rounds: plotly alone would tick at 0.5
    fig = plots.acceptance_figure(s)
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.title.text == "rounds"
    assert plots.count_dtick(40) == 8 and plots.count_dtick(0) == 1
