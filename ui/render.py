"""Round events -> escaped HTML: token spans, the legend, the live stats line, the environment card, errors.

The output HTML is append-only while a run streams (one span per token, no wrapper element around them), so
gradio's streaming diff sends only the new spans, and the page appends them (ui/stream.js) instead of parsing
the whole output again. A span carries its facts compactly (data-t); the page builds the tooltip from them on
hover, in the format token_tooltip() gives here.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from html import escape

from engine.stats import EMITTED_KINDS, KINDS, Round, Stats, Token, finite
from ui.explain import drafting_counts

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
MISSING = "-"  # a fact a token does not have, in data-t
PROB_HELP = {"p_target": "the target model's probability of this token",
             "p_draft": "the drafter's probability of the token it proposed"}


def _num(x: float | None, fmt: str) -> str | None:
    x = finite(x)
    return None if x is None else format(x, fmt)


def token_facts(tok: Token, latency_ms: float | None) -> list[str]:
    """id, draft position, latency ms, p_target, p_draft: the span's data-t, MISSING where a token has none (an
    endpoint's token may come as text without an id)."""
    return [str(tok.token_id) if tok.token_id >= 0 else MISSING,
            MISSING if tok.draft_position is None else str(tok.draft_position), _num(latency_ms, ".2f") or MISSING,
            _num(tok.p_target, ".3f") or MISSING, _num(tok.p_draft, ".3f") or MISSING]


def token_tooltip(kind: str, round_index: int, facts: list[str], mark: str | None = None,
                  inferred: bool = False) -> str:
    """The hover text of a span (page_js.OUTPUT_JS writes the same from data-t, data-mark and data-inferred).

    inferred: an endpoint's token whose kind was inferred from its chunk's token count."""
    token_id, pos, lat, p_target, p_draft = facts
    kind = f"{kind} (inferred from the chunk's token count)" if inferred else kind
    head = f"{kind} · token id {token_id}" if token_id != MISSING else kind
    parts = [f"{head} · round {round_index}" + (f" · special token {mark}" if mark else "")]
    if pos != MISSING:
        parts.append(f"draft position {pos}")
    parts.append(f"latency {lat} ms" if lat != MISSING else "not emitted")
    parts += [f"{name} {v} ({PROB_HELP[name]})" for name, v in (("p_target", p_target), ("p_draft", p_draft))
              if v != MISSING]
    return "\n".join(parts)


def token_span(tok: Token, text: str, round_index: int, latency_ms: float | None, special: bool = False) -> str:
    """One token as a span: class tok-<kind>, the text escaped, its facts in data-t for the tooltip. A special
    token (end of turn, bos) is a marker: no text of its own, its piece shown by CSS from data-mark."""
    if tok.kind not in KINDS:
        raise ValueError(f"token kind {tok.kind!r} is not one of {KINDS}")
    head = f'<span class="tok tok-{tok.kind}{" tok-special" if special else ""}" data-r="{round_index}" ' \
           f'data-t="{" ".join(token_facts(tok, latency_ms))}"' + (' data-inferred="1"' if tok.inferred else "")
    if special:
        return f'{head} data-mark="{escape(text, quote=True)}"></span>'
    return f"{head}>{escape(text)}</span>"


def round_spans(rnd: Round, text_of: Callable[[int], str], special_ids: Collection[int] = ()) -> str:
    """A round's tokens in engine order; an emitted token's latency is its share of the round's time. A token
    with text of its own (an endpoint's: its ids may not be ours) shows that text, never a marker."""
    token_ms = rnd.token_ms  # once per round: it counts the round's tokens
    return "".join(
        token_span(t, t.text if t.text is not None else text_of(t.token_id), rnd.index,
                   token_ms if t.kind in EMITTED_KINDS else None, t.text is None and t.token_id in special_ids)
        for t in rnd.tokens
    )


def render_rounds(rounds: Iterable[Round], text_of: Callable[[int], str], special_ids: Collection[int] = ()) -> str:
    return "".join(round_spans(r, text_of, special_ids) for r in rounds)


def legend_html(end_token: str | None) -> str:
    """The kinds' colours and the marker a special token shows as, with the model's own end-of-turn token (Qwen's
    <|im_end|>, Gemma's <eos> or <end_of_turn>): the legend shows what the output will."""
    items = "".join(
        f'<span class="tok tok-{k}" title="{escape(KIND_HELP[k], quote=True)}">{k}</span> ' for k in KINDS
    )
    mark = escape(end_token or "end", quote=True)
    special = ('<span class="ds-legend-special" title="a special token (the end of a turn): shown as a marker, not '
               f'as text"><span class="tok tok-target tok-special" data-mark="{mark}"></span> special token</span>')
    return f'<div class="ds-legend">{items}{special}</div>'


def _stat(label: str, value: str | None, title: str | None = None) -> str:
    if not value:
        return ""
    tip = f' title="{escape(title, quote=True)}"' if title else ""
    return f'<span class="ds-stat"{tip}><b>{label}</b> {escape(value)}</span>'


def stats_line(stats: Stats | None, *, running: bool = False, ceiling: str | None = None,
               notes: Sequence[str] = (), vs_plain: tuple[str, str] | None = None) -> str:
    """The headline figures of a run (or of the run so far); figures a run does not have are left out.

    ceiling: how the bandwidth ceiling was measured (the tooltip of "of bandwidth ceiling"); notes: sentences
    shown under the figures (how many rounds drafted and why, what streaming to the page costs the engine);
    vs_plain: (the run's "× N" over its plain baseline, how that baseline was measured), in place of a speedup."""
    s = stats.summary() if stats is not None else {}
    # an endpoint's run: the server decides how it decodes, whatever the page's mode says
    speculative = (stats is not None and stats.settings.get("mode", "plain") != "plain"
                   and stats.settings.get("backend") != "endpoint")
    itl = None
    if (p50 := _num(s.get("itl_p50_ms"), ".1f")) and (p99 := _num(s.get("itl_p99_ms"), ".1f")):
        itl = f"{p50} / {p99} ms"
    acc = finite(s.get("acceptance_rate"))
    speedup = _num(s.get("speedup"), ".2f")
    drafted = None
    if speculative and len(stats.rounds) > 1:
        drafted = "{} of {} rounds".format(*drafting_counts(stats))
    # a speculative round streams the weights once per verify pass (and the drafter's besides), so decode tok/s
    # over the one-step ceiling would overstate it: the figure is for plain runs only
    ceiling_pct = None if speculative else _num(s.get("pct_of_ceiling"), ".0f")
    parts = [
        _stat("tokens", str(s.get("tokens", 0))),
        _stat("TTFT", (v + " ms") if (v := _num(s.get("ttft_ms"), ".1f")) else None),
        _stat("ITL p50/p99", itl),
        _stat("tok/s", _num(s.get("decode_tok_s"), ".1f")),
        _stat("drafted in", drafted),
        _stat("acceptance", None if acc is None else f"{100 * acc:.0f}%"),
        _stat("mean accepted length", _num(s.get("mean_accepted_len"), ".2f")),
        _stat("vs plain", *vs_plain) if vs_plain else _stat("speedup", speedup + "×" if speedup else None),
        _stat("of bandwidth ceiling", ceiling_pct + "%" if ceiling_pct else None, ceiling),
        _stat("peak memory", (v + " MB") if (v := _num(s.get("peak_memory_mb"), ".0f")) else None),
    ]
    state = '<span class="ds-running">running</span>' if running else ""
    lines = "".join(f'<div class="ds-note">{escape(n)}</div>' for n in notes if n)
    return f'<div class="ds-stats">{state}{"".join(parts)}</div>{lines}'


def env_card(env: dict) -> str:
    """The machine and model this app serves: a two-column table, every value escaped."""
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in env.items()
    )
    return f'<table class="ds-env">{rows}</table>'


def message_html(text: str) -> str:
    return f'<div class="ds-message">{escape(text)}</div>'


def error_html(text: str, title: str = "Not run") -> str:
    """An error where the output goes: what went wrong and what to change, until the next run replaces it."""
    return f'<div class="ds-error" role="alert"><b>{escape(title)}:</b> {escape(text)}</div>'
