"""The Profile panel's figure and table: engine.profile Results in, a plotly Figure or rows out."""
from __future__ import annotations

import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.observe.breakdown import OP_CLASSES
from engine.stats import finite
from ui.plots import _base, empty_figure

OP_COLORS = {"matmul": "#4c78a8", "attention": "#f58518", "norm": "#54a24b", "rope": "#b279a2",
             "activation": "#eeca3b", "kv_write": "#9d755d", "sampling": "#e45756", "other": "#79706e",
             "host": "#d0cbc7"}
OP_HELP = {"host": "CPU: Python between ops · CUDA: device idle between kernels"}
PROFILE_HEADERS = ["configuration", "pass", "step ms", "profiled ms", "rows / step", "profiler cost %",
                   "outside kernels %", "GB/s", "% ceiling", "note"]
CAPTIONS = (
    "step → layer → op class: the tallest bars are where the time goes; grey host = time outside ops",
    "Op classes per pass (ms) against the step timed without the profiler (◆): the gap is the profiler's cost",
    "Achieved GB/s per op class in a decode step against the measured ceiling: far below it means overhead-bound",
)


def wrap(text: str, width: int = 60) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def _title(title: str, caption: str) -> str:
    return f"<b>{title}</b><br><span style='font-size:11px'>{caption}</span>"


def _by_class(result, kind: str) -> dict[str, float]:
    out = {c: 0.0 for c in OP_CLASSES}
    for r in result.rows:
        if r["pass"] == kind:
            out[r["op_class"]] += r["ms"]
    return out


def _pass(result, kind: str) -> dict | None:
    return next((s for s in result.summary if s["pass"] == kind), None)


def layer_bars(fig: go.Figure, result, col: int, legend: bool) -> None:
    """The decode step by layer, stacked by op class: step -> layer -> op class as bars."""
    rows = [r for r in result.rows if r["pass"] == "decode"]
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    for cls in OP_CLASSES:
        ms = {r["layer"]: r["ms"] for r in rows if r["op_class"] == cls}
        if not any(ms.values()):
            continue
        fig.add_trace(go.Bar(x=layers, y=[ms.get(layer, 0.0) for layer in layers], name=cls, legendgroup=cls,
                             showlegend=legend, marker_color=OP_COLORS[cls],
                             hovertemplate="layer %{x}<br>" + cls + ": %{y:.3f} ms<extra>" + result.config.label
                             + "</extra>"), row=1, col=col)


def profile_figure(results: list) -> go.Figure:
    """Icicles of one decode step per configuration, op classes per pass against the unprofiled step, and
    achieved GB/s per op class against the bandwidth ceiling. A configuration that could not run shows why."""
    title = "Profile: inside a step"
    ran = [r for r in results if r.reason is None]
    if not ran:
        notes = "<br>".join(f"{r.config.label}: {r.reason}" for r in results)
        return empty_figure(title, notes or "Press Profile to see where a step's time goes.", "profile")
    first, second = results[0], results[1] if len(results) > 1 else None
    steps = [_title(f"{r.config.label}: a decode step by layer", CAPTIONS[0]) if r.reason is None
             else f"<b>{r.config.label}: not run here</b>" for r in (first, second) if r]
    fig = make_subplots(
        rows=2, cols=2, vertical_spacing=0.2, horizontal_spacing=0.08,
        subplot_titles=(*steps, *([""] * (2 - len(steps))), _title("Op classes per pass", CAPTIONS[1]),
                        _title("Achieved bandwidth", CAPTIONS[2])))
    for col, r in ((1, first), (2, second)):
        if r is not None and r.reason is None:
            layer_bars(fig, r, col, legend=col == 1 or first.reason is not None)
            fig.update_xaxes(type="category", title_text="layer (embed, head, sample, engine: outside the blocks)",
                             row=1, col=col)
            fig.update_yaxes(title_text="ms per step", row=1, col=col)
        elif r is not None:  # the reason where the bars would be
            cell = fig.get_subplot(1, col)
            fig.add_annotation(text="<br>".join(wrap(r.reason)), showarrow=False,
                               xref="paper", yref="paper", x=sum(cell.xaxis.domain) / 2,
                               y=sum(cell.yaxis.domain) / 2, font=dict(size=12), align="center")
            fig.update_xaxes(visible=False, row=1, col=col)
            fig.update_yaxes(visible=False, row=1, col=col)
    names = [f"{r.config.label}<br>{s['pass']}" for r in ran for s in r.summary]
    for cls in OP_CLASSES:
        ys = [_by_class(r, s["pass"])[cls] for r in ran for s in r.summary]
        if any(ys):
            fig.add_trace(go.Bar(x=names, y=ys, name=cls, marker_color=OP_COLORS[cls], legendgroup=cls,
                                 showlegend=False, hovertemplate="%{x}<br>" + cls + ": %{y:.2f} ms<extra>"
                                 + OP_HELP.get(cls, "") + "</extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=names, y=[s["step_ms"] for r in ran for s in r.summary], mode="markers",
                             name="step without profiler", marker=dict(symbol="diamond", size=11, color="#222"),
                             hovertemplate="%{x}<br>%{y:.2f} ms without the profiler<extra></extra>"), row=2, col=1)
    ceiling, seen = None, set()
    for r in ran:
        gbs = {}
        for row in r.rows:
            if row["pass"] == "decode" and row["bytes"]:
                b, ms = gbs.get(row["op_class"], (0.0, 0.0))
                gbs[row["op_class"]] = (b + row["bytes"], ms + row["ms"])
        classes = [c for c in OP_CLASSES if c in gbs and gbs[c][1] > 0]
        seen.update(classes)
        fig.add_trace(go.Bar(x=classes, y=[gbs[c][0] / gbs[c][1] / 1e6 for c in classes], name=r.config.label,
                             showlegend=False, marker_color="#4c78a8" if r is first else "#f58518",
                             hovertemplate="%{x}: %{y:.1f} GB/s<extra>" + r.config.label + "</extra>"), row=2, col=2)
        ceiling = ceiling or finite(_pass(r, "decode")["bandwidth_gbs"])
    if ceiling:  # a trace, not a shape: shapes on a log axis take log10 positions
        fig.add_trace(go.Scatter(x=[c for c in OP_CLASSES if c in seen], y=[ceiling] * len(seen), mode="lines+text",
                                 line=dict(dash="dash", color="#555"), name="bandwidth ceiling",
                                 text=[f"ceiling {ceiling:.1f} GB/s (measured)"] + [""] * (len(seen) - 1),
                                 textposition="top right", hovertemplate="ceiling %{y:.1f} GB/s<extra></extra>"),
                      row=2, col=2)
    fig.update_layout(barmode="stack", bargap=0.3)
    fig.update_xaxes(title_text="configuration and pass", row=2, col=1)
    fig.update_yaxes(title_text="ms per pass", row=2, col=1)
    fig.update_xaxes(title_text="op class (decode step)", row=2, col=2)
    fig.update_yaxes(title_text="achieved GB/s (log)", type="log", row=2, col=2)
    fig = _base(fig, title, "profile", height=900)
    fig.update_layout(margin=dict(t=110, b=60), legend=dict(y=-0.12, yanchor="top", x=0, xanchor="left"))
    return fig


def _num(x, nd):
    return None if (x := finite(x)) is None else round(x, nd)


def profile_rows(results: list) -> list[list]:
    """One row per configuration and pass for the page's table; a configuration that could not run, its reason."""
    out = []
    for r in results:
        if r.reason is not None:
            out.append([r.config.label, None, None, None, None, None, None, None, None, r.reason])
            continue
        for s in r.summary:
            if "idle_ms" in s:
                outside = 100 * s["idle_ms"] / s["profiled_ms"]
                note = f"GPU idle; host issues the step in {s['host_ms']:.2f} ms, device busy {s['device_ms']:.2f} ms"
            else:
                outside = 100 * (s.get("python", 0.0) + s.get("dispatch", 0.0)) / s["profiled_ms"]
                note = "outside kernels = Python + dispatch"
            if s["pass"] == "verify":
                note += "; one pass, so noisier than the decode steps"
            ceiling = finite(s["bandwidth_gbs"])
            out.append([r.config.label, s["pass"], _num(s["step_ms"], 2), _num(s["profiled_ms"], 2),
                        _num(s["rows_vs_step"], 3), _num(s["profiler_overhead_pct"], 1), _num(outside, 1),
                        _num(s["gbs"], 2), _num(100 * s["gbs"] / ceiling, 1) if ceiling else None, note])
    return out
