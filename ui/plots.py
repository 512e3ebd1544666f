"""Figure builders: Stats in, a plotly Figure out (Compare's are in compare_plots.py, Profile's in
profile_plots.py). Nothing here measures anything."""
from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.stats import EMITTED_KINDS, PHASES, Stats, percentile
from ui.explain import drafter_note, schedule_note
from ui.render import KIND_COLORS

LANE_COLORS = {"draft": "#72b7b2", "target": "#4c78a8", "sample": "#f58518", "host": "#bab0ac",
               "calibration": "#b279a2", "calibration and prefill": "#b279a2", "drafter prefill": "#b279a2"}
ROLLING_WINDOW = 8


def _base(fig: go.Figure, title: str, revision: str, height: int = 320, subtitle: str = "") -> go.Figure:
    # A constant uirevision keeps the user's zoom and hidden traces while a run streams in. The backgrounds are
    # transparent so a figure sits on the page's own colour; in dark mode style.py recolours text and grid.
    fig.update_layout(
        title=dict(text=title, font=dict(size=14), subtitle=dict(text=subtitle, font=dict(size=12))),
        uirevision=revision, height=height, margin=dict(l=50, r=20, t=70 if subtitle else 60, b=40),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom", bgcolor="rgba(0,0,0,0)"),
        template="plotly_white", paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
    )
    return fig


def wrap_lines(text: str, width: int = 100) -> str:
    """Plotly does not wrap annotation text: break it into <br>-separated lines."""
    return "<br>".join(textwrap.wrap(text, width)) or text


def empty_figure(title: str, message: str, revision: str = "empty", height: int = 240, subtitle: str = "") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base(fig, title, revision, height=height, subtitle=subtitle)


def itl_figure(stats: Stats) -> go.Figure:
    """Per-token latency over token index coloured by kind, per-round latency, p50 / p99 lines."""
    title = "Inter-token latency"
    if len(stats.rounds) < 2:
        return empty_figure(title, "Latency appears once a second token is out.", "itl")
    xs, ys, kinds, rounds, round_x, round_y = [], [], [], [], [], []
    index = 1  # token 0 came from the prefill round; its latency is the TTFT
    for r in stats.rounds[1:]:
        token_ms = r.token_ms  # once per round: it counts the round's tokens
        for t in r.emitted:
            xs.append(index)
            ys.append(token_ms)
            kinds.append(t.kind)
            rounds.append(r.index)
            index += 1
        round_x.append(index - 1)
        round_y.append(r.total_ms)
    fig = go.Figure()
    if len(round_x) != len(xs):  # rounds and tokens coincide in plain decoding: one line is enough
        fig.add_trace(go.Scatter(
            x=round_x, y=round_y, mode="lines", name="round time", line=dict(color="#999", width=1),
            hovertemplate="round ending at token %{x}<br>%{y:.2f} ms<extra></extra>",
        ))
    for kind in EMITTED_KINDS:
        sel = [i for i, k in enumerate(kinds) if k == kind]
        if not sel:
            continue
        fig.add_trace(go.Scatter(
            x=[xs[i] for i in sel], y=[ys[i] for i in sel], mode="markers", name=kind,
            marker=dict(color=KIND_COLORS[kind], size=5), customdata=[rounds[i] for i in sel],
            hovertemplate="token %{x} · round %{customdata}<br>%{y:.2f} ms<extra>" + kind + "</extra>",
        ))
    for q, dash in ((50, "dot"), (99, "dash")):  # named in the legend, where no label can sit on the axis
        v = percentile(ys, q)
        fig.add_trace(go.Scatter(x=[xs[0], xs[-1]], y=[v, v], mode="lines", name=f"p{q} {v:.2f} ms",
                                 line=dict(dash=dash, color="#777", width=1), hoverinfo="skip"))
    ttft = stats.rounds[0].t_end_ms
    lane, setup_ms = setup_lane(stats), stats.rounds[0].draft_ms
    setup = f", {setup_ms:.0f} ms of it the drafter's {lane}" if lane and setup_ms else ""
    fig.update_xaxes(title_text="token index")
    fig.update_yaxes(title_text="ms per token", rangemode="tozero")
    fig = _base(fig, f"{title} (TTFT {ttft:.1f} ms{setup})", "itl", height=360)
    # up to seven entries: under the plot, where they wrap without running into the title
    fig.update_layout(margin=dict(b=90), legend=dict(x=0, xanchor="left", y=0, yref="container", yanchor="bottom"))
    return fig


def setup_lane(stats: Stats) -> str | None:
    """What a speculative run's drafter does in round 0 (its draft_ms there): a layer-skip drafter calibrating
    on the prompt (over a short prompt, making the target's prefill with it), any other its own prefill. It
    drafts nothing, so it is never drawn as a draft."""
    if stats.settings.get("mode", "plain") == "plain":
        return None
    info = stats.drafter_info
    if info.get("layer_set") == "calibrated":
        return "calibration and prefill" if info.get("calibration_prefilled") else "calibration"
    return "drafter prefill"


def steps_figure(stats: Stats) -> go.Figure:
    """Where each round's time went: one lane per phase, bars over wall time since the run started."""
    title = "Step timeline"
    if not stats.rounds:
        return empty_figure(title, "The timeline appears when a run starts.", "steps")
    setup = setup_lane(stats)
    lanes = ([setup] if setup else []) + list(PHASES)
    segments: dict[str, list[tuple[float, float, int]]] = {lane: [] for lane in lanes}  # (start, ms, round)
    for r in stats.rounds:
        for phase, start, ms in r.phases():
            segments[setup if setup and r.index == 0 and phase == "draft" else phase].append((start, ms, r.index))
    fig = go.Figure()
    for lane, segs in segments.items():
        if not segs:
            continue
        fig.add_trace(go.Bar(
            orientation="h", y=[lane] * len(segs), x=[d for _, d, _ in segs], base=[s for s, _, _ in segs],
            name=lane, marker=dict(color=LANE_COLORS[lane], line=dict(width=0)),
            customdata=[[r, s] for s, _, r in segs],
            hovertemplate="round %{customdata[0]}<br>start %{customdata[1]:.2f} ms<br>%{x:.3f} ms<extra>"
            + lane + "</extra>",
        ))
    fig.update_layout(barmode="overlay", bargap=0.3)
    fig.update_yaxes(categoryorder="array", categoryarray=[lane for lane in reversed(lanes) if segments[lane]])
    fig.update_xaxes(title_text="wall time since the prompt was handed over (ms)")
    return _base(fig, title, "steps", height=260)


def rolling_acceptance(stats: Stats, window: int = ROLLING_WINDOW) -> tuple[list[int], list[float]]:
    """Acceptance rate over the last `window` speculative rounds, at each speculative round."""
    spec = [r for r in stats.rounds if r.n_drafted]
    xs, ys = [], []
    for i, r in enumerate(spec):
        chunk = spec[max(0, i - window + 1) : i + 1]
        xs.append(r.index)
        ys.append(sum(c.n_accepted for c in chunk) / sum(c.n_drafted for c in chunk))
    return xs, ys


def with_gaps(xs: list[int], ys: list[float]) -> tuple[list, list]:
    """A break (None) wherever rounds without a draft lie between two that drafted: the line joins only rounds
    next to each other, so a stretch of plain steps is a gap, not a slope nobody measured."""
    gx, gy = [], []
    for x, y in zip(xs, ys, strict=True):
        if gx and x - gx[-1] > 1:
            gx.append(None)
            gy.append(None)
        gx.append(x)
        gy.append(y)
    return gx, gy


def count_dtick(top: float) -> int:
    """A whole-number tick step for an axis of counts (plotly would put ticks at 0.5 on a short one)."""
    return max(1, math.ceil(top / 5))


def acceptance_figure(stats: Stats) -> go.Figure:
    title = "Draft acceptance"
    chosen = stats.chosen_k()
    if not any(r.n_drafted for r in stats.rounds):
        if not chosen:
            return empty_figure(title, "No drafts in this run: pick a speculative mode to see acceptance.", "acc")
        # a speculative run whose schedule never drafted: say so and why, not four empty axes
        return empty_figure(title, wrap_lines(schedule_note(stats)), "acc", height=240, subtitle=drafter_note(stats))
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.2, subplot_titles=(
        "rounds by accepted drafts", "acceptance by draft position",
        f"rolling acceptance ({ROLLING_WINDOW} rounds)", "k per round (0: plain step), accepted",
    ))
    fig.update_annotations(font_size=13)  # subplot titles: two fit side by side on a narrow screen
    k = max([r.n_drafted for r in stats.rounds] + [k for _, k in chosen])
    hist = stats.accepted_histogram()
    counts = list(range(k + 1))
    fig.add_trace(go.Bar(x=counts, y=[hist.get(n, 0) for n in counts], marker_color=KIND_COLORS["accepted"],
                         hovertemplate="%{y} rounds accepted %{x}<extra></extra>"), row=1, col=1)
    pos = stats.per_position_acceptance()
    fig.add_trace(go.Bar(x=list(range(len(pos))), y=pos, marker_color=KIND_COLORS["bonus"],
                         hovertemplate="position %{x}: %{y:.0%}<extra></extra>"), row=1, col=2)
    xs, ys = with_gaps(*rolling_acceptance(stats))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line=dict(color=KIND_COLORS["target"]),
                             marker=dict(size=4), connectgaps=False,
                             hovertemplate="round %{x}: %{y:.0%}<extra></extra>"), row=2, col=1)
    accepted = {r.index: r.n_accepted for r in stats.rounds if r.n_drafted}
    fig.add_trace(go.Bar(x=[i for i, _ in chosen], y=[k for _, k in chosen], marker_color="#bab0ac", name="k",
                         hovertemplate="round %{x}: k=%{y}<extra></extra>"), row=2, col=2)
    fig.add_trace(go.Scatter(x=list(accepted), y=list(accepted.values()), mode="markers", name="accepted",
                             marker=dict(color=KIND_COLORS["accepted"], size=5),
                             hovertemplate="round %{x}: %{y} accepted<extra></extra>"), row=2, col=2)
    fig.update_xaxes(title_text="accepted", dtick=1, range=[-0.5, k + 0.5], row=1, col=1)
    fig.update_yaxes(title_text="rounds", dtick=count_dtick(max(hist.values(), default=1)), tick0=0, row=1, col=1)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=2)
    fig.update_xaxes(title_text="round", row=2, col=1)
    fig.update_xaxes(title_text="round", row=2, col=2)
    # each y range starts a little below zero: its "0" label then sits above the x axis's first label, not on it
    fig.update_yaxes(range=[-0.06, 1.05], tickformat=".0%", row=1, col=2)
    fig.update_yaxes(range=[-0.06, 1.05], tickformat=".0%", row=2, col=1)
    fig.update_yaxes(range=[-0.3, k + 0.5], dtick=1 if k <= 8 else 2, row=2, col=2)
    fig.update_layout(showlegend=False, barmode="overlay")
    fig = _base(fig, title, "acc", height=560, subtitle=drafter_note(stats))
    if fig.layout.title.subtitle.text:  # room for the subtitle above the subplot titles
        fig.update_layout(margin=dict(t=100))
    return fig
