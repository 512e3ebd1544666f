"""Figure builders: Stats (or compare results) in, a plotly Figure out. Nothing here measures anything."""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.stats import EMITTED_KINDS, PHASES, Stats, finite, percentile
from ui.render import KIND_COLORS

LANE_COLORS = {"draft": "#72b7b2", "target": "#4c78a8", "sample": "#f58518", "host": "#bab0ac"}
ROLLING_WINDOW = 8


def _base(fig: go.Figure, title: str, revision: str, height: int = 320) -> go.Figure:
    # A constant uirevision keeps the user's zoom and hidden traces while a run streams in.
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), uirevision=revision, height=height,
        margin=dict(l=50, r=20, t=60, b=40),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom"),
        template="plotly_white",
    )
    return fig


def empty_figure(title: str, message: str, revision: str = "empty") -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _base(fig, title, revision, height=240)


def itl_figure(stats: Stats) -> go.Figure:
    """Per-token latency over token index coloured by kind, per-round latency, p50 / p99 lines."""
    title = "Inter-token latency"
    if len(stats.rounds) < 2:
        return empty_figure(title, "Latency appears once a second token is out.", "itl")
    xs, ys, kinds, rounds, round_x, round_y = [], [], [], [], [], []
    index = 1  # token 0 came from the prefill round; its latency is the TTFT
    for r in stats.rounds[1:]:
        for t in r.emitted:
            xs.append(index)
            ys.append(r.token_ms)
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
    for q, dash, where in ((50, "dot", "bottom left"), (99, "dash", "top right")):  # apart when p50 ~ p99
        v = percentile(ys, q)
        fig.add_hline(y=v, line=dict(dash=dash, color="#555", width=1),
                      annotation_text=f"p{q} {v:.2f} ms", annotation_position=where)
    ttft = stats.rounds[0].t_end_ms
    fig.update_xaxes(title_text="token index")
    fig.update_yaxes(title_text="ms per token", rangemode="tozero")
    return _base(fig, f"{title} (TTFT {ttft:.1f} ms)", "itl")


def steps_figure(stats: Stats) -> go.Figure:
    """Where each round's time went: one lane per phase, bars over wall time since the run started."""
    title = "Step timeline"
    if not stats.rounds:
        return empty_figure(title, "The timeline appears when a run starts.", "steps")
    segments: dict[str, list[tuple[float, float, int]]] = {lane: [] for lane in PHASES}  # (start, ms, round)
    for r in stats.rounds:
        for phase, start, ms in r.phases():
            segments[phase].append((start, ms, r.index))
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
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(PHASES)))
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


def drafter_note(stats: Stats) -> str:
    """What the drafter chose at the start of the run, in a line (the layers a layer-skip drafter skips)."""
    info = stats.drafter_info
    if info.get("skipped_layers"):
        how = "calibrated on the prompt" if info.get("layer_set") == "calibrated" else "given"
        note = (f"runs {info['draft_layers']} of {info['target_layers']} layers, skips {info['skipped_layers']} "
                f"({how}")
        if info.get("calibrated_acceptance") is not None:
            note += f"; {info['calibrated_acceptance']:.0%} expected acceptance"
        return note + ")"
    if info.get("draft_weights"):
        return f"drafts with {info['draft_layers']} layers in {info['draft_weights']} weights"
    return ""


def acceptance_figure(stats: Stats) -> go.Figure:
    title = "Draft acceptance"
    chosen = stats.chosen_k()
    if not any(r.n_drafted for r in stats.rounds) and not chosen:
        return empty_figure(title, "No drafts in this run: pick a speculative mode to see acceptance.", "acc")
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.2, subplot_titles=(
        "rounds by accepted drafts", "acceptance by draft position",
        f"rolling acceptance ({ROLLING_WINDOW} rounds)", "k chosen per round (0: a plain step) and accepted",
    ))
    k = max([r.n_drafted for r in stats.rounds] + [k for _, k in chosen])
    hist = stats.accepted_histogram()
    counts = list(range(k + 1))
    fig.add_trace(go.Bar(x=counts, y=[hist.get(n, 0) for n in counts], marker_color=KIND_COLORS["accepted"],
                         hovertemplate="%{y} rounds accepted %{x}<extra></extra>"), row=1, col=1)
    pos = stats.per_position_acceptance()
    fig.add_trace(go.Bar(x=list(range(len(pos))), y=pos, marker_color=KIND_COLORS["bonus"],
                         hovertemplate="position %{x}: %{y:.0%}<extra></extra>"), row=1, col=2)
    xs, ys = rolling_acceptance(stats)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=KIND_COLORS["target"]),
                             hovertemplate="round %{x}: %{y:.0%}<extra></extra>"), row=2, col=1)
    accepted = {r.index: r.n_accepted for r in stats.rounds if r.n_drafted}
    fig.add_trace(go.Bar(x=[i for i, _ in chosen], y=[k for _, k in chosen], marker_color="#bab0ac", name="k",
                         hovertemplate="round %{x}: k=%{y}<extra></extra>"), row=2, col=2)
    fig.add_trace(go.Scatter(x=list(accepted), y=list(accepted.values()), mode="markers", name="accepted",
                             marker=dict(color=KIND_COLORS["accepted"], size=5),
                             hovertemplate="round %{x}: %{y} accepted<extra></extra>"), row=2, col=2)
    fig.update_xaxes(title_text="accepted", dtick=1, range=[-0.5, k + 0.5], row=1, col=1)
    fig.update_xaxes(title_text="draft position", dtick=1, row=1, col=2)
    fig.update_xaxes(title_text="round", row=2, col=1)
    fig.update_xaxes(title_text="round", row=2, col=2)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=2)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=2, col=1)
    fig.update_yaxes(range=[0, k + 0.5], dtick=1 if k <= 8 else 2, row=2, col=2)
    fig.update_layout(showlegend=False, barmode="overlay")
    note = drafter_note(stats)
    return _base(fig, f"{title}<br><sup>{note}</sup>" if note else title, "acc", height=520)


@dataclass
class CompareEntry:
    """One configuration of a Compare run: its stats, or the reason this machine could not run it."""
    group: str  # what is being compared, e.g. "CUDA graphs"
    label: str  # this side of it, e.g. "eager"
    stats: Stats | None = None
    reason: str | None = None
    baseline: bool = False  # the side the other one's speedup is measured against

    @property
    def tok_s(self) -> float:
        return self.stats.summary()["decode_tok_s"] if self.stats else float("nan")

    @property
    def speedup(self) -> float | None:
        """Over the group's baseline (Stats.baseline_tok_s, which Compare sets); None for the baseline."""
        return finite(self.stats.summary().get("speedup")) if self.stats else None

    def step_ms(self, q: float) -> float:
        return percentile([r.total_ms for r in self.stats.rounds[1:]], q) if self.stats else float("nan")


def compare_figure(entries: list[CompareEntry]) -> go.Figure:
    """Grouped bars of tok/s and step ms p50 / p99 with speedups, ITL distributions side by side."""
    title = "Compare"
    ran = [e for e in entries if e.stats]
    skipped = [e for e in entries if not e.stats]
    notes = "<br>".join(f"not run: {e.group} / {e.label}: {e.reason}" for e in skipped)
    if not ran:
        return empty_figure(title, notes or "Press Compare to run the prompt under each configuration.", "cmp")
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "decode tok/s", "step ms: p50 (blue), p99 (red)", "ITL distribution"))
    names = [f"{e.group}<br>{e.label}" for e in ran]
    text = [f"×{e.speedup:.2f}" if e.speedup is not None else "" for e in ran]
    colors = ["#bab0ac" if e.baseline else "#4c78a8" for e in ran]
    fig.add_trace(go.Bar(x=names, y=[e.tok_s for e in ran], text=text, textposition="outside",
                         marker_color=colors, name="tok/s", hovertemplate="%{x}<br>%{y:.1f} tok/s<extra></extra>"),
                  row=1, col=1)
    for q, color in ((50, "#4c78a8"), (99, "#e45756")):
        fig.add_trace(go.Bar(x=names, y=[e.step_ms(q) for e in ran], name=f"step p{q}", marker_color=color,
                             hovertemplate="%{x}<br>%{y:.2f} ms<extra>p" + str(q) + "</extra>"), row=1, col=2)
    for e, name in zip(ran, names, strict=True):
        fig.add_trace(go.Box(y=e.stats.token_latencies_ms(), name=name, boxpoints=False, showlegend=False,
                             marker_color="#bab0ac" if e.baseline else "#4c78a8"), row=1, col=3)
    fig.update_layout(barmode="group", bargap=0.25, showlegend=False)
    fig.update_yaxes(range=[0, 1.2 * max(e.tok_s for e in ran)], row=1, col=1)  # room for the speedup labels
    fig.update_yaxes(title_text="ms per token", row=1, col=3)
    if notes:
        fig.add_annotation(text=notes, showarrow=False, xref="paper", yref="paper", x=0, y=-0.45,
                           xanchor="left", align="left", font=dict(size=11))
    fig = _base(fig, title, "cmp", height=420)
    fig.update_layout(margin=dict(b=40 + 18 * (len(skipped) + 4)))
    return fig


def compare_rows(entries: list[CompareEntry]) -> list[list]:
    """A table of the same figures for the page and the summary CSV: one row per configuration."""
    rows = []
    for e in entries:
        if e.stats is None:
            rows.append([e.group, e.label, None, None, None, None, e.reason])
            continue
        rows.append([e.group, e.label, round(e.tok_s, 2), round(e.step_ms(50), 3), round(e.step_ms(99), 3),
                     None if e.speedup is None else round(e.speedup, 3), "baseline" if e.baseline else ""])
    return rows


COMPARE_HEADERS = ["comparison", "configuration", "tok/s", "step p50 ms", "step p99 ms", "speedup", "note"]
