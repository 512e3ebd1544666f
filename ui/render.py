"""Round events -> escaped HTML: token spans, the legend, the live stats line, the environment card.

The output HTML is append-only while a run streams (one span per token, no wrapper element around
them), so gradio's streaming diff sends only the new spans each update.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from html import escape

from engine.stats import EMITTED_KINDS, KINDS, Round, Token, finite

KIND_COLORS = {
    "target": "#4c78a8",
    "accepted": "#2ca02c",
    "rejected": "#d62728",
    "resampled": "#ff7f0e",
    "bonus": "#9467bd",
}
KIND_HELP = {
    "target": "plain decode step",
    "accepted": "draft token the target accepted",
    "rejected": "draft token the target rejected (not part of the output)",
    "resampled": "drawn from the residual distribution at a rejection",
    "bonus": "extra target token after every draft was accepted",
}


def _num(x: float | None, fmt: str) -> str | None:
    x = finite(x)
    return None if x is None else format(x, fmt)


def token_tooltip(tok: Token, round_index: int, latency_ms: float | None) -> str:
    kind = f"{tok.kind} (inferred from the chunk's token count)" if tok.inferred else tok.kind
    parts = [f"{kind} · token id {tok.token_id} · round {round_index}" if tok.token_id >= 0 else
             f"{kind} · round {round_index}"]
    if tok.draft_position is not None:
        parts.append(f"draft position {tok.draft_position}")
    lat = _num(latency_ms, ".2f")
    parts.append(f"latency {lat} ms" if lat else "not emitted")
    for name, p in (("p_target", tok.p_target), ("p_draft", tok.p_draft)):
        if (v := _num(p, ".3f")) is not None:
            parts.append(f"{name} {v}")
    return "\n".join(parts)


def token_span(tok: Token, text: str, round_index: int, latency_ms: float | None) -> str:
    """One token as a span: class tok-<kind>, the text escaped, a tooltip with what is known of it."""
    if tok.kind not in KINDS:
        raise ValueError(f"token kind {tok.kind!r} is not one of {KINDS}")
    title = escape(token_tooltip(tok, round_index, latency_ms), quote=True).replace("\n", "&#10;")
    return f'<span class="tok tok-{tok.kind}" data-r="{round_index}" title="{title}">{escape(text)}</span>'


def round_spans(rnd: Round, text_of: Callable[[int], str]) -> str:
    """A round's tokens in engine order; an emitted token's latency is its share of the round's time."""
    return "".join(
        token_span(t, t.text if t.text is not None else text_of(t.token_id), rnd.index,
                   rnd.token_ms if t.kind in EMITTED_KINDS else None)
        for t in rnd.tokens
    )


def render_rounds(rounds: Iterable[Round], text_of: Callable[[int], str]) -> str:
    return "".join(round_spans(r, text_of) for r in rounds)


def legend_html() -> str:
    items = "".join(
        f'<span class="tok tok-{k}" title="{escape(KIND_HELP[k], quote=True)}">{k}</span> ' for k in KINDS
    )
    return f'<div class="ds-legend">{items}</div>'


def _stat(label: str, value: str | None) -> str:
    return f'<span class="ds-stat"><b>{label}</b> {value}</span>' if value else ""


def stats_line(summary: dict, *, running: bool = False) -> str:
    """The headline figures of a run (or of the run so far); figures a run does not have are left out."""
    s = summary
    itl = None
    if (p50 := _num(s.get("itl_p50_ms"), ".1f")) and (p99 := _num(s.get("itl_p99_ms"), ".1f")):
        itl = f"{p50} / {p99} ms"
    acc = _num(100 * (finite(s.get("acceptance_rate")) or float("nan")), ".0f")
    ceiling = _num(s.get("pct_of_ceiling"), ".0f")
    mem = _num(s.get("peak_memory_mb"), ".0f")
    speedup = _num(s.get("speedup"), ".2f")
    parts = [
        _stat("tokens", str(s.get("tokens", 0))),
        _stat("TTFT", (v + " ms") if (v := _num(s.get("ttft_ms"), ".1f")) else None),
        _stat("ITL p50/p99", itl),
        _stat("tok/s", _num(s.get("decode_tok_s"), ".1f")),
        _stat("acceptance", acc + "%" if acc else None),
        _stat("mean accepted length", _num(s.get("mean_accepted_len"), ".2f")),
        _stat("speedup", speedup + "×" if speedup else None),
        _stat("of bandwidth ceiling", ceiling + "%" if ceiling else None),
        _stat("peak memory", mem + " MB" if mem else None),
    ]
    state = '<span class="ds-running">running</span>' if running else ""
    return f'<div class="ds-stats">{state}{"".join(parts)}</div>'


def env_card(env: dict) -> str:
    """The machine and model this app serves: a two-column table, every value escaped."""
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in env.items()
    )
    return f'<table class="ds-env">{rows}</table>'


def message_html(text: str) -> str:
    return f'<div class="ds-message">{escape(text)}</div>'
