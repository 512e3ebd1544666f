"""The Compare panel's figure and table: CompareEntry records in, a plotly Figure or rows out.

The question a Compare answers is "which configuration is fastest here", and next "what does each switch
buy": one row per configuration, decode tok/s and the time per token (a speculative round's time shared by
the tokens it emitted, so rows compare whatever a round does), on log axes so that a reference path tens of
times slower than the rest leaves every row readable. The fastest run is marked; a speedup names its baseline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.stats import Stats, finite
from ui.plots import _base, empty_figure

BASELINE_COLOR, RUN_COLOR, FASTEST_COLOR = "#9d9d9d", "#4c78a8", "#e6a100"
ROW_PX = 34


@dataclass
class CompareEntry:
    """One configuration of a Compare run: its stats, or the reason this machine could not run it."""
    group: str  # what is being compared, e.g. "CUDA graphs"
    label: str  # this side of it, e.g. "eager"
    stats: Stats | None = None
    reason: str | None = None
    baseline: bool = False  # the side the other one's speedup is measured against
    run: str = ""  # the run's label: one run can stand in several groups (plain fp32 is a baseline thrice)
    baseline_label: str = ""  # what the speedup is over, e.g. "fp32 weights"

    @property
    def name(self) -> str:
        return f"{self.group}: {self.label}"

    @property
    def tok_s(self) -> float:
        return self.stats.summary()["decode_tok_s"] if self.stats else float("nan")

    @property
    def speedup(self) -> float | None:
        """Over the group's baseline (Stats.baseline_tok_s, which Compare sets); None for the baseline."""
        return finite(self.stats.summary().get("speedup")) if self.stats else None

    def token_ms(self, q: int) -> float:
        """Time per emitted token at percentile q = 50 or 99: Stats' ITL, a round's time shared by its tokens."""
        return self.stats.summary()[f"itl_p{q}_ms"] if self.stats else float("nan")


def fastest(entries: list[CompareEntry]) -> CompareEntry | None:
    ran = [e for e in entries if e.stats is not None and finite(e.tok_s) is not None]
    return max(ran, key=lambda e: e.tok_s) if ran else None


def _bar_text(e: CompareEntry, best: CompareEntry) -> str:
    text = f"{e.tok_s:.0f} tok/s" if e.tok_s >= 10 else f"{e.tok_s:.1f} tok/s"
    if e.speedup is not None:  # what it is over: the hover and the table's "over" column (a label this short
        text += f"  ×{e.speedup:.2f}"  # stays clear of the latency panel's markers on an 800 px window)
    return text + ("  ★" if e.run == best.run else "")


def compare_figure(entries: list[CompareEntry]) -> go.Figure:
    """Per configuration: decode tok/s (bars, log axis) and the time per token (box of the run's token latencies
    with its p99 marked), baseline and compared runs coloured apart, the fastest run marked."""
    title = "Compare"
    ran = [e for e in entries if e.stats is not None]
    skipped = [e for e in entries if e.stats is None]
    notes = "<br>".join(f"not run: {e.name}: {e.reason}" for e in skipped)
    if not ran:
        return empty_figure(title, notes or "Press Compare to run the prompt under each configuration.", "cmp")
    best = fastest(ran)
    names = [e.name for e in ran]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.6, 0.4], horizontal_spacing=0.03,
                        subplot_titles=("decode tok/s (log scale)", "ms per token (log scale)<br>box p25-p75, ◆ p99"))
    for is_base, legend in ((True, "baseline"), (False, "compared")):
        sel = [e for e in ran if e.baseline == is_base]
        if not sel:
            continue
        fig.add_trace(go.Bar(
            y=[e.name for e in sel], x=[e.tok_s for e in sel], orientation="h", name=legend,
            marker=dict(color=BASELINE_COLOR if is_base else RUN_COLOR,
                        line=dict(color=[FASTEST_COLOR if e.run == best.run else "rgba(0,0,0,0)" for e in sel],
                                  width=3)),
            text=[_bar_text(e, best) for e in sel], textposition="outside", cliponaxis=False,
            customdata=[f"×{e.speedup:.2f} vs {e.baseline_label or 'baseline'}" if e.speedup else "" for e in sel],
            hovertemplate="%{y}<br>%{x:.1f} tok/s %{customdata}<extra>" + legend + "</extra>"), row=1, col=1)
    for e in ran:
        fig.add_trace(go.Box(x=e.stats.token_latencies_ms(), y=[e.name] * len(e.stats.token_latencies_ms()),
                             orientation="h", name=e.name, boxpoints=False, showlegend=False,
                             marker_color=BASELINE_COLOR if e.baseline else RUN_COLOR), row=1, col=2)
    fig.add_trace(go.Scatter(x=[e.token_ms(99) for e in ran], y=names, mode="markers", name="p99 per token",
                             marker=dict(symbol="diamond", size=8, color="#e45756"),
                             hovertemplate="%{y}<br>p99 %{x:.2f} ms per token<extra></extra>"), row=1, col=2)
    lo = min(e.tok_s for e in ran)
    hi = max(e.tok_s for e in ran)
    # log axes: a path tens of times slower than the rest keeps its row readable; the room on the right holds
    # the bar labels
    fig.update_xaxes(type="log", dtick="D2", range=[_log10(lo / 1.6), _log10(hi * 12)], row=1, col=1)
    fig.update_xaxes(type="log", dtick="D2", row=1, col=2)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(list(dict.fromkeys(names)))),
                     automargin=True, row=1, col=1)
    fig.update_layout(barmode="group", bargap=0.35, boxmode="group")
    rows = len(dict.fromkeys(names))
    subtitle = f"fastest here: {best.run} ({best.tok_s:.0f} tok/s)" if best else ""
    fig = _base(fig, title, "cmp", height=140 + ROW_PX * rows + 18 * len(skipped), subtitle=subtitle)
    if notes:
        fig.add_annotation(text=notes, showarrow=False, xref="paper", yref="paper", x=0, y=0, yshift=-40,
                           xanchor="left", yanchor="top", align="left", font=dict(size=11))
    # the legend above the subplot titles, beside the figure's title
    fig.update_layout(margin=dict(l=10, r=20, t=130, b=40 + 18 * len(skipped)),
                      legend=dict(orientation="h", x=1, xanchor="right", y=0.98, yanchor="top", yref="container"))
    return fig


def _log10(x: float) -> float:
    return math.log10(max(x, 1e-9))


def compare_rows(entries: list[CompareEntry]) -> list[list]:
    """A table of the same figures for the page: one row per configuration."""
    best = fastest(entries)
    rows = []
    for e in entries:
        if e.stats is None:
            rows.append([e.group, e.label, None, None, None, None, None, e.reason])
            continue
        note = "baseline" if e.baseline else ""
        if best is not None and e.run == best.run:
            note = "fastest" + (", baseline" if e.baseline else "")
        rows.append([e.group, e.label, round(e.tok_s, 2), round(e.token_ms(50), 3), round(e.token_ms(99), 3),
                     None if e.speedup is None else f"×{e.speedup:.2f}", e.baseline_label or None, note])
    return rows


COMPARE_HEADERS = ["comparison", "configuration", "tok/s", "ms/token p50", "ms/token p99", "speedup", "over",
                   "note"]
