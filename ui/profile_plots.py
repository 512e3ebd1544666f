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
PROFILE_HEADERS = ["configuration", "pass", "step ms", "profiled ms", "profiled ÷ step", "profiler cost %",
                   "outside kernels %", "GB/s", "% ceiling", "note"]
# wide enough for each header's longest word ("profiled", "kernels") and each cell's ("decode", "verify" in the
# table's font with its padding); the note, a sentence, gets the most room
PROFILE_COLUMN_WIDTHS = ["150px", "84px", "72px", "92px", "92px", "88px", "92px", "64px", "80px", "400px"]
CONFIG_COLOR = "#17becf"  # a hue no op class uses; the second configuration is the same hue, hatched
CAPTIONS = (
    "step → layer → op class: the tallest bars are where the time goes; grey host = time outside ops",
    "Op classes per pass (ms) against the step timed without the profiler (◆): the gap is the profiler's cost",
    "GB/s per op class, a bar per configuration, against the ceiling (dashed): far below it = overhead-bound",
)


def wrap(text: str, width: int = 60) -> list[str]:
    return textwrap.wrap(text, width) or [""]


CAPTION_CHARS = 48  # a caption line that fits half of an 800 px window's plot (676 px there) at 11 px


def _title(title: str, caption: str) -> str:
    lines = "<br>".join(wrap(caption, CAPTION_CHARS))
    return f"<b>{title}</b><br><span style='font-size:11px'>{lines}</span>"


def _by_class(result, kind: str) -> dict[str, float]:
    out = {c: 0.0 for c in OP_CLASSES}
    for r in result.rows:
        if r["pass"] == kind:
            out[r["op_class"]] += r["ms"]
    return out


def head_share(result, kind: str = "decode") -> tuple[float, float]:
    """(ms, % of the profiled pass) of the LM head (the layer "head"): with a large vocabulary (Gemma 3's 262k
    tokens) it outweighs all the blocks, which the op-class bars, where it is one more matmul, do not show."""
    ms = sum(r["ms"] for r in result.rows if r["pass"] == kind and r["layer"] == "head")
    s = _pass(result, kind)
    return ms, 100 * ms / s["profiled_ms"] if s and s["profiled_ms"] else 0.0


def _pass(result, kind: str) -> dict | None:
    return next((s for s in result.summary if s["pass"] == kind), None)


def stacked(x: list, ys: list[list[float]]) -> list[list[float]]:
    """The base of each series when they stack in order. The figure's bars are grouped (barmode "group", so the
    bandwidth subplot can put configurations side by side); the stacked subplots stack by hand: one offsetgroup
    per subplot, each trace starting where the ones before it end."""
    bases, run = [], [0.0] * len(x)
    for y in ys:
        bases.append(list(run))
        run = [a + b for a, b in zip(run, y, strict=True)]
    return bases


def layer_bars(fig: go.Figure, result, col: int, legend: bool) -> None:
    """The decode step by layer, stacked by op class: step -> layer -> op class as bars."""
    rows = [r for r in result.rows if r["pass"] == "decode"]
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    series = {}
    for cls in OP_CLASSES:
        ms = {r["layer"]: r["ms"] for r in rows if r["op_class"] == cls}
        if any(ms.values()):
            series[cls] = [ms.get(layer, 0.0) for layer in layers]
    for (cls, ys), base in zip(series.items(), stacked(layers, list(series.values())), strict=True):
        fig.add_trace(go.Bar(x=layers, y=ys, base=base, offsetgroup=f"layers{col}", name=cls, legendgroup=cls,
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
    steps = [_title(f"{r.config.label}:<br>a decode step by layer", CAPTIONS[0]) if r.reason is None
             else f"<b>{r.config.label}: not run here</b>" for r in (first, second) if r]
    fig = make_subplots(
        rows=2, cols=2, vertical_spacing=0.3, horizontal_spacing=0.1,
        subplot_titles=(*steps, *([""] * (2 - len(steps))), _title("Op classes per pass", CAPTIONS[1]),
                        _title("Achieved bandwidth", CAPTIONS[2])))
    for col, r in ((1, first), (2, second)):
        if r is not None and r.reason is None:
            layer_bars(fig, r, col, legend=col == 1 or first.reason is not None)
            # upright labels, every layer named while ~16 fit half of an 800 px window, else every other block
            layers = list(dict.fromkeys(row["layer"] for row in r.rows if row["pass"] == "decode"))
            step = 1 if len(layers) <= 16 else 2
            fig.update_xaxes(type="category", title_text="layer (embed, head, sample,<br>engine: outside the blocks)",
                             tickangle=-90, tickfont=dict(size=10), row=1, col=col,
                             tickvals=[x for x in layers if not x.isdigit() or int(x) % step == 0])
            fig.update_yaxes(title_text="ms per step", row=1, col=col)
        elif r is not None:  # the reason where the bars would be
            cell = fig.get_subplot(1, col)
            fig.add_annotation(text="<br>".join(wrap(r.reason)), showarrow=False,
                               xref="paper", yref="paper", x=sum(cell.xaxis.domain) / 2,
                               y=sum(cell.yaxis.domain) / 2, font=dict(size=12), align="center")
            fig.update_xaxes(visible=False, row=1, col=col)
            fig.update_yaxes(visible=False, row=1, col=col)
    # two-level labels: the pass under each bar, its configuration once under the pair (no rotated text)
    names = [[r.config.label for r in ran for _ in r.summary], [s["pass"] for r in ran for s in r.summary]]
    series = {cls: ys for cls in OP_CLASSES
              if any(ys := [_by_class(r, s["pass"])[cls] for r in ran for s in r.summary])}
    for (cls, ys), base in zip(series.items(), stacked(names[1], list(series.values())), strict=True):
        fig.add_trace(go.Bar(x=names, y=ys, base=base, offsetgroup="passes", name=cls, marker_color=OP_COLORS[cls],
                             legendgroup=cls, showlegend=False, hovertemplate="%{x}<br>" + cls + ": %{y:.2f} ms<extra>"
                             + OP_HELP.get(cls, "") + "</extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=names, y=[s["step_ms"] for r in ran for s in r.summary], mode="markers",
                             name="step without profiler",
                             marker=dict(symbol="diamond", size=11, color="#333", line=dict(color="#fff", width=1.5)),
                             hovertemplate="%{x}<br>%{y:.2f} ms without the profiler<extra></extra>"), row=2, col=1)
    bandwidth_bars(fig, ran, first)
    fig.update_layout(barmode="group", bargap=0.3, bargroupgap=0.05)
    fig.update_xaxes(title_text="configuration and pass", row=2, col=1)
    fig.update_yaxes(title_text="ms per pass", row=2, col=1)
    fig.update_xaxes(title_text="op class (decode step)", row=2, col=2)
    fig = _base(fig, title, "profile", height=1080)
    # the legend in the bottom margin, under the two-level labels and the axis title, wherever the width puts them
    fig.update_layout(margin=dict(t=180, b=150), title=dict(y=0.99, yref="container", yanchor="top"),
                      legend=dict(y=0, yref="container", yanchor="bottom", x=0, xanchor="left"))
    return fig


def bandwidth_bars(fig: go.Figure, ran: list, first) -> None:
    """GB/s per op class in a decode step, one bar per configuration side by side (labelled with its value), on a
    linear axis with room above for the ceiling: a dashed line labelled with the bandwidth it stands for."""
    top, ceiling = 0.0, ceiling_of(ran)
    for r in ran:
        gbs = {}
        for row in r.rows:
            if row["pass"] == "decode" and row["bytes"]:
                b, ms = gbs.get(row["op_class"], (0.0, 0.0))
                gbs[row["op_class"]] = (b + row["bytes"], ms + row["ms"])
        classes = [c for c in OP_CLASSES if c in gbs and gbs[c][1] > 0]
        ys = [gbs[c][0] / gbs[c][1] / 1e6 for c in classes]
        top = max([top, *ys])
        hatch = dict(shape="" if r is first else "/", fgcolor=CONFIG_COLOR, solidity=0.5)
        fig.add_trace(go.Bar(x=classes, y=ys, name=r.config.label, offsetgroup=r.config.label,
                             marker=dict(color=CONFIG_COLOR if r is first else "rgba(0,0,0,0)", pattern=hatch,
                                         line=dict(color=CONFIG_COLOR, width=1)),
                             text=[_gbs(y) for y in ys], textposition="outside", cliponaxis=False,
                             hovertemplate="%{x}: %{y:.2f} GB/s<extra>" + r.config.label + "</extra>"), row=2, col=2)
    if ceiling and top > ceiling:  # a bar above the line would be a share over 100%: the probe read low
        # in the room above the bars, right-aligned: clear of the axis's tick labels on the left
        fig.add_annotation(text="<br>".join(wrap(under_read(ceiling, top, probes_of(ran)), 40)), showarrow=False,
                           xref="x4 domain", yref="y4 domain", x=1, y=1, xanchor="right", yanchor="top",
                           font=dict(size=11), align="right")
    elif ceiling:
        fig.add_hline(y=ceiling, line=dict(dash="dash", color="#888", width=1.5), row=2, col=2,
                      annotation=dict(text=f"ceiling {ceiling:.1f} GB/s ({ceiling_source(ran)})", font=dict(size=11)),
                      annotation_position="top right")
    room = 1.8 if ceiling and top > ceiling else 1.25  # above the bars: the ceiling's label, or why there is none
    fig.update_yaxes(title_text="achieved GB/s", range=[0, room * max(top, ceiling or 0.0) or 1.0], row=2, col=2)


def ceiling_of(ran: list) -> float | None:
    """The bandwidth the profile is set against: the best any configuration's decode pass was given."""
    seen = [c for r in ran if (c := finite(_pass(r, "decode")["bandwidth_gbs"])) is not None]
    return max(seen) if seen else None


def probes_of(ran: list) -> list[float]:
    return next((s["probes_gbs"] for r in ran for s in r.summary if s.get("probes_gbs")), [])


def ceiling_source(ran: list) -> str:
    probes = probes_of(ran)
    return f"best of {len(probes)} probes around this profile" if probes else "measured at launch"


def under_read(ceiling: float, achieved: float, probes: list[float]) -> str:
    """Why no ceiling is drawn: the raw figures, and that the probe, not the step, is wrong."""
    read = ", ".join(f"{x:.1f}" for x in probes) if len(probes) > 1 else f"{ceiling:.1f}"
    return (f"No ceiling drawn: the bandwidth probe read {read} GB/s, less than the {achieved:.1f} GB/s a step "
            "achieved, so the probe under-read (another job on the memory bus, or a cache it fit in).")


def _gbs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _num(x, nd):
    return None if (x := finite(x)) is None else round(x, nd)


def formats_note(result, kind: str) -> str:
    """'by weight format: q4_k 742 MB in 20.1 ms (37 GB/s), q6_k ...' for one pass: each format's bytes a pass
    reads and, where the kernels name their format, its projections' time; empty for one dense format."""
    rows = [f for f in result.formats if f["pass"] == kind]
    if not rows or (len(rows) == 1 and rows[0]["ms"] is None):
        return ""
    parts = [f"{f['format']} {f['bytes'] / 1e6:,.1f} MB" + (f" in {f['ms']:.2f} ms ({_gbs(f['gbs'])} GB/s)"
                                                            if f["ms"] else "") for f in rows]
    return "; by weight format: " + ", ".join(parts)


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
            head_ms, head_pct = head_share(r, s["pass"])
            note += f"; LM head {head_ms:.2f} ms ({head_pct:.0f}% of the pass)" + formats_note(r, s["pass"])
            ceiling, share = finite(s["bandwidth_gbs"]), None
            if ceiling and s["gbs"] > ceiling:  # never a share over 100%: the probe read low
                note += f"; {s['gbs']:.1f} GB/s achieved against a probed {ceiling:.1f}: the probe under-read"
            elif ceiling:
                share = _num(100 * s["gbs"] / ceiling, 1)
            out.append([r.config.label, s["pass"], _num(s["step_ms"], 2), _num(s["profiled_ms"], 2),
                        _num(s["rows_vs_step"], 3), _num(s["profiler_overhead_pct"], 1), _num(outside, 1),
                        _num(s["gbs"], 2), share, note])
    return out
