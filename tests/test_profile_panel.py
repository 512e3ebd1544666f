"""The Profile panel (ui/profile.py, ui/profile_plots.py) called directly on the tiny runtime."""
import json

import gradio as gr
import pandas as pd
import pytest

from engine.observe import profile as engine_profile
from ui.models import Runtimes
from ui import profile
from ui import run as ui_run
from ui.run import Session, parse_settings
from ui.profile_plots import PROFILE_HEADERS, profile_figure, profile_rows
from ui.startup import build_runtime
from ui.testing import tiny_settings
from runtimes import QUIET

PROMPT = "one two three, one two three"
# the bandwidth "measured at launch": above what any step achieves, or the panel draws no ceiling and says the probe
# under-read (the tiny model's torch step, from cache, reached 11.7 GB/s on a Zen 5)
CEILING_GBS = 1000.0


@pytest.fixture(scope="module")
def rt():
    rt = build_runtime(tiny=True, **QUIET)
    rt.engine.bandwidth_gbs = CEILING_GBS
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def outputs(rt):
    """Against CUDA graphs: on a machine without a GPU (CI's), a second configuration that cannot run."""
    if rt.graphs_reason is None:
        pytest.skip("checks the panel's reason for a configuration this machine cannot run (CUDA graphs here run)")
    session = Session()
    outs = list(profile.run_profile(Runtimes(rt), session, PROMPT, "CUDA graphs", 3, **tiny_settings()))
    return session, outs


def test_first_a_status_then_everything(outputs):
    _, outs = outputs
    assert len(outs) == 2 and "Profiling" in outs[0][0]
    assert all(isinstance(x, type(gr.skip())) for x in outs[0][1:])
    status, fig, table, csv_path, trace_path = outs[1]
    assert "Profiled in" in status and "not run" in status and "Machine:" in status
    assert len(table[0]) == len(PROFILE_HEADERS)


def test_table_has_both_passes_and_the_reason(rt, outputs):
    table = outputs[1][1][2]
    assert [row[:2] for row in table[:2]] == [["eager · torch · fp32", "decode"], ["eager · torch · fp32", "verify"]]
    assert table[2][0] == "graph · torch · fp32" and table[2][-1] == f"CUDA graphs unavailable: {rt.graphs_reason}"
    assert 0.5 < table[0][4] < 3  # rows / step: the tiny model is all overhead, so only a sanity range


def test_csv_opens_in_pandas_one_row_per_configuration_pass_layer_and_class(rt, outputs):
    df = pd.read_csv(outputs[1][1][3])
    assert list(df.columns) == profile.CSV_COLUMNS
    ran = df[df["note"].isna()]
    assert not ran.duplicated(["configuration", "pass", "layer", "op_class"]).any()
    assert set(ran["pass"]) == {"decode", "verify"}
    assert {str(i) for i in range(rt.n_layers)} <= set(ran["layer"].astype(str))
    skipped = df[df["note"].notna()]
    assert list(skipped["configuration"]) == ["graph · torch · fp32"]
    decode = ran[ran["pass"] == "decode"]
    assert decode["pct_of_step"].sum() == pytest.approx(100, abs=0.01)


def test_trace_is_strict_trace_event_json_with_a_process_per_configuration(outputs):
    with open(outputs[1][1][4], encoding="utf-8") as f:
        trace = json.loads(f.read(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    events = trace["traceEvents"]
    assert all("ph" in e for e in events)
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) for e in spans)
    assert all(isinstance(e["pid"], int) for e in events if "pid" in e)
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert names and all(n.startswith("eager · torch · fp32: ") for n in names)
    assert any(e["name"] == "decodescope/step" for e in spans)


def test_figure_has_axis_titles_units_and_captions(outputs):
    fig = outputs[1][1][1]
    layout = fig.to_plotly_json()["layout"]
    axes = {k: v for k, v in layout.items() if k.startswith(("xaxis", "yaxis")) and v.get("visible", True)}
    assert len(axes) == 6  # layers (one configuration ran; the other panel shows its reason), passes, GB/s
    assert all(a.get("title", {}).get("text") for a in axes.values())
    assert {"ms per step", "ms per pass", "achieved GB/s"} <= {a["title"]["text"] for a in axes.values()}
    texts = [a["text"] for a in layout["annotations"]]
    assert sum("<span style='font-size:11px'>" in t for t in texts) == 3  # one caption line per panel that ran
    assert "<b>graph · torch · fp32: not run here</b>" in texts
    assert any(t.startswith("CUDA graphs unavailable:") for t in texts)
    assert f"ceiling {CEILING_GBS:.1f} GB/s (measured at launch)" in texts  # the value, on the line (no probe)
    assert [s["y0"] for s in layout["shapes"]] == [CEILING_GBS]


def fake_result(label: str, scale: float, ceiling: float = 30.0):
    """A profiled configuration as engine.observe.profile returns it, with made-up figures (figure tests only)."""
    rows, summary = [], []
    for kind in ("decode", "verify"):
        for layer in ("0", "1", "head"):
            for cls, ms, nbytes in (("matmul", 1.0, 27e6), ("attention", 0.2, 1e5), ("norm", 0.05, 4e3)):
                rows.append(dict(configuration=label, **{"pass": kind}, layer=layer, op_class=cls, calls=1,
                                 ms=ms * scale, pct_of_step=0.0, bytes=nbytes, gbs=nbytes / (ms * scale) / 1e6))
        summary.append({"pass": kind, "step_ms": 3.9 * scale, "profiled_ms": 4.0 * scale, "rows_vs_step": 1.03,
                        "profiler_overhead_pct": 3.0, "gbs": 25.0 / scale, "bandwidth_gbs": ceiling,
                        "python": 0.5, "dispatch": 0.2})
    return engine_profile.Result(engine_profile.Config(label), rows=rows, summary=summary)


def test_achieved_bandwidth_is_grouped_per_configuration_on_a_linear_axis():
    """Two configurations side by side per op class (not stacked on a log axis), told apart in the legend and
    from the op classes' colours, each bar labelled with its value, the ceiling a labelled line above them."""
    from ui.profile_plots import CONFIG_COLOR, OP_COLORS

    fig = profile_figure([fake_result("eager · fused · q4", 1.0), fake_result("eager · torch · fp32", 1.04)])
    bars = [t for t in fig.data if t.type == "bar" and t.xaxis == "x4"]
    assert [t.name for t in bars] == ["eager · fused · q4", "eager · torch · fp32"]
    assert bars[0].offsetgroup != bars[1].offsetgroup and fig.layout.barmode == "group"
    assert all(t.showlegend is not False for t in bars)
    assert CONFIG_COLOR not in OP_COLORS.values() and bars[1].marker.pattern.shape == "/"
    matmul = [t.y[list(t.x).index("matmul")] for t in bars]
    assert matmul == pytest.approx([27.0, 27 / 1.04])  # each its own, not their sum
    assert bars[0].text[list(bars[0].x).index("matmul")] == "27"
    assert fig.layout.yaxis4.type != "log" and fig.layout.yaxis4.range[1] > 30.0  # room above the ceiling
    # the stacked panels still stack: each op class starts where the one below it ends
    passes = [t for t in fig.data if t.type == "bar" and t.xaxis == "x3"]
    assert len({t.offsetgroup for t in passes}) == 1
    assert passes[1].base[0] == pytest.approx(passes[0].y[0])


def test_compare_with_the_current_configuration_says_so():
    from ui.profile import same_note, status_line

    note = same_note("weights fp32", [engine_profile.Config("eager · torch · fp32")])
    assert "one configuration was profiled" in note and "weights fp32" in note
    assert same_note("kernels", [engine_profile.Config("a"), engine_profile.Config("b")]) == ""
    line = status_line([fake_result("eager · torch · fp32", 1.0)], 1.0, {"flags": []}, note)
    assert note in line


@pytest.mark.parametrize("against,changed", [("kernels", "fused"), ("CUDA graphs", "graphs"),
                                             ("weights q4", "weights")])
def test_the_second_configuration_changes_one_thing(rt, against, changed):
    s = parse_settings(tiny_settings())
    cur, other = profile.configs(rt, s, against)
    diff = {f for f in ("fused", "graphs", "weights") if getattr(cur, f) != getattr(other, f)}
    assert diff == {changed} and cur.label != other.label


def test_same_weights_compare_with_itself_once(rt):
    s = parse_settings(tiny_settings())
    assert len(profile.configs(rt, s, "weights fp32")) == 1


def test_another_weight_format_loads_on_first_use_and_runs_beside(rt):
    outs = list(profile.run_profile(Runtimes(rt), Session(), PROMPT, "weights q4", 2, **tiny_settings()))
    assert "q4" in rt.engines and rt.engines["q4"].model.weight_format == "q4"
    table = outs[-1][2]
    assert {row[0] for row in table} == {"eager · torch · fp32", "eager · torch · q4"}
    assert all(row[2] is not None and row[2] > 0 for row in table)  # both ran: step times, not reasons


@pytest.mark.parametrize("against,steps,needle", [("nonsense", 4, "compare with 'nonsense'"),
                                                  ("kernels", 99, "profile steps=99"),
                                                  ("kernels", 2.5, "must be a whole number")])
def test_bad_inputs_are_errors_naming_the_value(rt, against, steps, needle):
    with pytest.raises(gr.Error, match=needle):
        list(profile.run_profile(Runtimes(rt), Session(), PROMPT, against, steps, **tiny_settings()))


def test_empty_prompt_profiles_a_synthetic_context(rt):
    outs = list(profile.run_profile(Runtimes(rt), Session(), "", "kernels", 2, **tiny_settings()))
    assert "Profiled in" in outs[-1][0]


def test_the_session_s_files_go_with_it(rt, outputs):
    session, outs = outputs
    folder = rt.store.root / session.profile_dir
    assert folder.is_dir()
    ui_run.end_session(rt, session)
    assert not folder.exists()


def test_nothing_ran_is_a_figure_with_the_reasons():
    res = [engine_profile.Result(engine_profile.Config("a"), reason="no GPU")]
    fig = profile_figure(res)
    assert "a: no GPU" in fig.layout.annotations[0].text
    assert profile_rows(res) == [["a", None, None, None, None, None, None, None, None, "no GPU"]]


def test_environment_card_says_what_the_machine_was_doing(rt):
    assert {"CPU", "CPU clock", "load average", "flags at launch"} <= set(rt.env)


def test_default_comparison_is_one_the_page_can_afford():
    from types import SimpleNamespace

    import torch

    def runtime(device, fmt, fused_reason=None, graphs_reason="no GPU"):
        return SimpleNamespace(engine=SimpleNamespace(device=torch.device(device)), weight_format=fmt,
                               fused_reason=fused_reason, graphs_reason=graphs_reason,
                               formats=lambda: {"fp32": None, "fp16": None, "int8": None, "q4": None})

    assert profile.default_against(runtime("cpu", "fp32")) == "kernels"
    # a quantized format's torch twin dequantizes every weight on every call: fp32 weights instead
    assert profile.default_against(runtime("cpu", "q4")) == "weights fp32"
    assert profile.default_against(runtime("cpu", "q4", fused_reason="no compiler")) == "kernels"
    assert profile.default_against(runtime("cuda", "q4", graphs_reason=None)) == "kernels"
    assert profile.default_against(runtime("cuda", "bf16", fused_reason="no nvcc", graphs_reason=None)) == "CUDA graphs"


def test_the_lm_head_is_named_with_its_share_of_the_pass():
    """The head is one more matmul in the op-class bars; the status and the table say what it takes (on Gemma 3
    270M, with its 262k-token vocabulary, more than any block)."""
    from ui.profile import status_line
    from ui.profile_plots import head_share

    r = fake_result("eager · fused · q4", 1.0)  # the head's rows: 1.0 + 0.2 + 0.05 ms of a 4 ms profiled pass
    assert head_share(r) == pytest.approx((1.25, 31.25))
    assert "(the LM head 1.2 ms, 31% of it profiled)" in status_line([r], 1.0, {"flags": []})
    assert [row[-1].endswith("LM head 1.25 ms (31% of the pass)") for row in profile_rows([r])] == [True, True]


def test_a_probe_that_under_read_draws_no_share_above_the_ceiling():
    """Steps that streamed faster than the probe read: no line under the bars, no "% ceiling" over 100; the
    panel says the probe under-read and gives the raw figures."""
    r = fake_result("eager · fused · q4", 1.0, ceiling=24.7)  # matmul at 27 GB/s, the pass at 25
    for s in r.summary:
        s["probes_gbs"] = [24.7, 22.0, 23.5]
    r.summary[1]["gbs"] = 20.0  # the verify pass stayed under it
    fig = profile_figure([r])
    layout = fig.to_plotly_json()["layout"]
    assert not layout.get("shapes")
    note = next(a["text"] for a in layout["annotations"] if "under-read" in a["text"]).replace("<br>", " ")
    assert "24.7, 22.0, 23.5 GB/s" in note and "27.0 GB/s" in note
    assert layout["yaxis4"]["range"][1] > 27.0
    table = profile_rows([r])
    assert [row[8] for row in table] == [None, pytest.approx(100 * 20 / 24.7, abs=0.1)]
    assert "25.0 GB/s achieved against a probed 24.7: the probe under-read" in table[0][-1]


def test_the_ceiling_names_the_probes_it_is_the_best_of():
    r = fake_result("eager · fused · q4", 1.0, ceiling=45.8)
    for s in r.summary:
        s["probes_gbs"] = [24.7, 45.8]
    texts = [a.text for a in profile_figure([r]).layout.annotations]
    assert "ceiling 45.8 GB/s (best of 2 probes around this profile)" in texts


def test_the_ratio_column_is_named_for_what_it_holds():
    """The column holds the profiled pass's op classes added up over the plain step's time."""
    r = fake_result("eager · fused · q4", 1.0)
    column = PROFILE_HEADERS.index("profiled ÷ step")
    assert "rows / step" not in PROFILE_HEADERS
    assert profile_rows([r])[0][column] == r.summary[0]["rows_vs_step"]


def test_the_table_gives_bytes_and_time_per_weight_format():
    """A GGUF file mixes formats: the note of each pass names each format's bytes and its projections' time."""
    r = fake_result("eager · fused · q4_k", 1.0)
    for kind in ("decode", "verify"):
        r.formats += [dict({"pass": kind}, format="q4_k", bytes=742e6, ms=20.1, calls=112, gbs=742e6 / 20.1 / 1e6),
                      dict({"pass": kind}, format="q6_k", bytes=121.5e6, ms=4.0, calls=29, gbs=121.5e6 / 4.0 / 1e6)]
    notes = [row[-1] for row in profile_rows([r])]
    assert all(n.endswith("; by weight format: q4_k 742.0 MB in 20.10 ms (37 GB/s), q6_k 121.5 MB in 4.00 ms "
                          "(30 GB/s)") for n in notes)
    untimed = fake_result("eager · torch · fp32", 1.0)  # the torch twins name no format; one format says nothing
    untimed.formats = [dict({"pass": "decode"}, format="fp32", bytes=1e6, ms=None, calls=None, gbs=None)]
    assert "by weight format" not in profile_rows([untimed])[0][-1]
