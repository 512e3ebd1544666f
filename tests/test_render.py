import re
from html.parser import HTMLParser

import pytest

from engine.stats import KINDS, Round, Token
from ui import render
from ui.testing import synthetic_rounds, synthetic_stats, text_of


class Spans(HTMLParser):
    """Collects (classes, title, text) for each span the HTML holds."""

    def __init__(self):
        super().__init__()
        self.spans, self._open = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "img" or tag == "script":
            raise AssertionError(f"markup from model text leaked into the page: <{tag}>")
        if tag == "span":
            a = dict(attrs)
            self._open = [a.get("class", "").split(), a.get("title"), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(tuple(self._open))
            self._open = None


def parse(html):
    p = Spans()
    p.feed(html)
    p.close()
    return p.spans


def test_each_kind_gets_its_class():
    rnd = Round(3, [Token(i, k, 0 if k in ("accepted", "rejected") else None) for i, k in enumerate(KINDS)], 0, 8)
    spans = parse(render.round_spans(rnd, lambda i: f"x{i}"))
    assert [s[0] for s in spans] == [["tok", f"tok-{k}"] for k in KINDS]
    assert [s[2] for s in spans] == [f"x{i}" for i in range(len(KINDS))]


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="'weird'"):
        render.token_span(Token(1, "weird"), "a", 0, 1.0)


def test_model_text_is_escaped():
    hostile = '<img src=x onerror=alert(1)>"&\'${x}'
    html = render.token_span(Token(5, "target"), hostile, 0, 1.0)
    (span,) = parse(html)
    assert span[2] == hostile  # shown as text, character for character
    assert "<img" not in html and "&lt;img" in html


def test_tooltip_names_id_round_position_latency_and_probabilities():
    html = render.token_span(Token(42, "accepted", 2, 0.8125, 1.0), "a", 7, 3.25)
    (span,) = parse(html)
    title = span[1]
    for part in ("token id 42", "round 7", "draft position 2", "latency 3.25 ms", "p_target 0.812", "p_draft 1.000"):
        assert part in title, (part, title)
    assert "\n" in title  # one fact a line


def test_rejected_tooltip_says_not_emitted_and_latency_is_shared_by_emitted_tokens():
    rnd = Round(1, [Token(1, "accepted", 0), Token(2, "rejected", 1), Token(3, "resampled")], 10.0, 16.0)
    spans = parse(render.round_spans(rnd, str))
    assert "latency 3.00 ms" in spans[0][1] and "latency 3.00 ms" in spans[2][1]
    assert "not emitted" in spans[1][1]


def test_render_rounds_is_append_only_while_streaming():
    rounds = synthetic_rounds(10, k=4, seed=1)
    prev = ""
    for n in range(1, len(rounds) + 1):
        html = render.render_rounds(rounds[:n], text_of)
        assert html.startswith(prev)
        prev = html
    assert len(parse(prev)) == sum(len(r.tokens) for r in rounds)


def test_stats_line_shows_headline_figures_and_skips_missing_ones():
    spec = render.stats_line(synthetic_stats(20, k=4).summary())
    for label in ("TTFT", "ITL p50/p99", "tok/s", "acceptance", "mean accepted length", "peak memory",
                  "of bandwidth ceiling"):
        assert label in spec
    plain = render.stats_line(synthetic_stats(20).summary(), running=True)
    assert "acceptance" not in plain and "running" in plain
    assert re.search(r"tok/s</b> [0-9.]+", plain)


def test_env_card_escapes_values():
    html = render.env_card({"model": "<b>m</b>", "device": "cpu"})
    assert "<b>m</b>" not in html and "&lt;b&gt;" in html


def test_legend_lists_every_kind():
    html = render.legend_html()
    assert all(f"tok-{k}" in html for k in KINDS)
