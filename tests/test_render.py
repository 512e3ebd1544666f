import json
import re
from html.parser import HTMLParser

import pytest

from engine.request import Request
from engine.stats import KINDS, Round, Stats, Token
from ui import render
from ui.explain import q4_a8_evidence, schedule_note, verify_note, verify_slope
from ui.testing import synthetic_rounds, synthetic_stats, text_of


class Spans(HTMLParser):
    """Collects (classes, attributes, text) for each span the HTML holds."""

    def __init__(self):
        super().__init__()
        self.spans, self._open = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "img" or tag == "script":
            raise AssertionError(f"markup from model text leaked into the page: <{tag}>")
        if tag == "span":
            a = dict(attrs)
            self._open = [a.get("class", "").split(), a, ""]

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


def tooltip(span):
    """The hover text the page builds from a span (page_js.OUTPUT_JS does the same in the browser)."""
    classes, attrs, _ = span
    kind = next(c for c in classes if c.startswith("tok-") and c != "tok-special").removeprefix("tok-")
    return render.token_tooltip(kind, int(attrs["data-r"]), attrs["data-t"].split(" "), attrs.get("data-mark"),
                                "data-inferred" in attrs)


def test_tooltip_names_id_round_position_latency_and_probabilities():
    html = render.token_span(Token(42, "accepted", 2, 0.8125, 1.0), "a", 7, 3.25)
    (span,) = parse(html)
    title = tooltip(span)
    for part in ("token id 42", "round 7", "draft position 2", "latency 3.25 ms", "p_target 0.812", "p_draft 1.000"):
        assert part in title, (part, title)
    assert "\n" in title  # one fact a line
    assert "p_target 0.812 (the target model's probability of this token)" in title
    assert "p_draft 1.000 (the drafter's probability of the token it proposed)" in title
    assert "title" not in span[1]  # built on hover: a span carries a few numbers, not a paragraph


def test_an_endpoint_token_shows_its_own_text_and_says_what_was_inferred():
    # a server's token: text of its own, no id of ours, its kind inferred from the chunk's token count
    rnd = Round(2, [Token(-1, "accepted", 0, text="<|im_end|>", inferred=True), Token(3, "target", text="hi")], 0, 4)
    spans = parse(render.round_spans(rnd, lambda i: "ours", special_ids={3}))
    assert [s[2] for s in spans] == ["<|im_end|>", "hi"]  # the server's text, never a marker by our ids
    assert all("tok-special" not in s[0] for s in spans)
    first = tooltip(spans[0])
    assert first.startswith("accepted (inferred from the chunk's token count) · round 2") and "token id" not in first
    assert tooltip(spans[1]).startswith("target · token id 3 · round 2")


def test_a_span_is_compact():
    html = render.token_span(Token(42, "accepted", 2, 0.8125, 1.0), "a", 7, 3.25)
    assert len(html) < 100, html


def test_rejected_tooltip_says_not_emitted_and_latency_is_shared_by_emitted_tokens():
    rnd = Round(1, [Token(1, "accepted", 0), Token(2, "rejected", 1), Token(3, "resampled")], 10.0, 16.0)
    spans = parse(render.round_spans(rnd, str))
    assert "latency 3.00 ms" in tooltip(spans[0]) and "latency 3.00 ms" in tooltip(spans[2])
    assert "not emitted" in tooltip(spans[1])


def test_special_tokens_are_markers_not_text():
    rnd = Round(1, [Token(5, "target"), Token(2, "target")], 0.0, 4.0)
    spans = parse(render.round_spans(rnd, lambda i: "<|im_end|>" if i == 2 else "hi", special_ids={2}))
    assert spans[0][2] == "hi" and "tok-special" not in spans[0][0]
    classes, attrs, text = spans[1]
    assert "tok-special" in classes and text == "" and attrs["data-mark"] == "<|im_end|>"
    assert "special token <|im_end|>" in tooltip(spans[1])


def test_render_rounds_is_append_only_while_streaming():
    rounds = synthetic_rounds(10, k=4, seed=1)
    prev = ""
    for n in range(1, len(rounds) + 1):
        html = render.render_rounds(rounds[:n], text_of)
        assert html.startswith(prev)
        prev = html
    assert len(parse(prev)) == sum(len(r.tokens) for r in rounds)


def test_stats_line_shows_headline_figures_and_skips_missing_ones():
    spec = render.stats_line(synthetic_stats(20, k=4))
    for label in ("TTFT", "ITL p50/p99", "tok/s", "acceptance", "mean accepted length", "peak memory", "drafted in"):
        assert label in spec
    plain = render.stats_line(synthetic_stats(20), running=True)
    assert "acceptance" not in plain and "running" in plain and "of bandwidth ceiling" in plain
    assert re.search(r"tok/s</b> [0-9.]+", plain)


def all_rejected_stats():
    """A speculative run whose every draft was rejected: acceptance 0, not missing."""
    s = synthetic_stats(12, k=3, seed=4)
    for r in s.rounds[1:]:
        r.tokens = [Token(1, "rejected", 0, 0.2, 1.0), Token(2, "resampled", None, 0.5)]
    return s


def test_zero_acceptance_shows_as_zero_percent():
    html = render.stats_line(all_rejected_stats())
    assert re.search(r"acceptance</b> 0%", html), html


def test_speculative_runs_leave_out_the_bandwidth_share():
    """A round streams the weights once per verify pass and the drafter's besides: tok/s over the one-step
    ceiling is no share of anything."""
    assert "of bandwidth ceiling" not in render.stats_line(synthetic_stats(20, k=4))
    ceiling = render.stats_line(synthetic_stats(20), ceiling="measured before and after")
    assert 'title="measured before and after"' in ceiling


def test_stats_line_counts_the_rounds_that_drafted():
    s = synthetic_stats(10, k=3)
    for r in s.rounds[1:4]:  # three plain steps the schedule chose
        r.tokens, r.n_drafted, r.k = [Token(1, "target")], 0, 0
    assert "drafted in</b> 6 of 9 rounds" in render.stats_line(s)


def test_notes_are_escaped_lines_under_the_figures():
    html = render.stats_line(synthetic_stats(5), notes=["<b>why</b>", ""])
    assert html.count('class="ds-note"') == 1 and "&lt;b&gt;why" in html


def test_error_html_escapes_and_names_itself():
    html = render.error_html("k=<40>")
    assert "Not run" in html and "&lt;40&gt;" in html and 'role="alert"' in html


def test_env_card_escapes_values():
    html = render.env_card({"model": "<b>m</b>", "device": "cpu"})
    assert "<b>m</b>" not in html and "&lt;b&gt;" in html


def test_legend_lists_every_kind_and_the_model_s_own_end_token():
    html = render.legend_html("<end_of_turn>")
    assert all(f"tok-{k}" in html for k in KINDS)
    assert 'data-mark="&lt;end_of_turn&gt;"' in html and "im_end" not in html


def test_a_run_that_drafted_every_round_is_counted_once():
    s = synthetic_stats(14, k=3)
    assert "drafted in</b> 13 of 13 rounds" in render.stats_line(s, notes=[schedule_note(s)])
    assert schedule_note(s) == ""  # the stats line says it; a note would repeat it


def verify_stats(plain_ms: float, verify: list[tuple[float, int]], plain_rounds: int = 4) -> Stats:
    """A speculative run's rounds: plain steps of plain_ms, then drafted rounds of (target_ms, drafts)."""
    rounds = [Round(0, [], 0.0, 10.0, target_ms=10.0)]
    rounds += [Round(i, [], 0.0, plain_ms, target_ms=plain_ms, k=0) for i in range(1, plain_rounds + 1)]
    rounds += [Round(len(rounds) + i, [], 0.0, ms, target_ms=ms, n_drafted=n, k=n) for i, (ms, n) in enumerate(verify)]
    return Stats(rounds, prompt_len=3, settings=dict(mode="n-gram", k=8))


def test_verify_note_names_q4_a8_only_where_a_q4_verify_position_costs_much():
    slow = verify_stats(4.0, [(4.0 * (1 + 0.42 * 5), 5), (4.0 * (1 + 0.42 * 3), 3)])
    assert verify_slope(slow) == pytest.approx(0.42)
    note = verify_note(slow, "q4")
    assert "0.42 of a plain step" in note and "q4_a8" in note and "spec-cpu-q4-q4_a8" in note
    assert verify_note(slow, "q4_a8") == "" and verify_note(slow, "fp32") == ""  # the hint is q4's
    assert verify_note(verify_stats(4.0, [(4.0 * (1 + 0.1 * 5), 5)]), "q4") == ""  # a cheap verify: nothing to say
    assert verify_slope(verify_stats(4.0, [(9.0, 5)], plain_rounds=2)) is None  # too few plain steps to compare
    assert verify_slope(verify_stats(4.0, [])) is None


def test_q4_a8_evidence_reads_the_committed_benchmarks(tmp_path):
    """The note's figures are the benchmarks' own, at the page's k, with the CPU they ran on; none without them."""
    assert q4_a8_evidence(tmp_path) == ""
    rows = [dict(target=t, set=s, temperature=0.0, mode=m, k=k, speedup=x) for t, s, m, k, x in [
        ("q4", "edit", "ngram", 8, 1.234), ("q4", "edit", "ngram", 16, 9.0), ("q4", "prose", "ngram", 8, 8.0),
        ("q4_a8", "edit", "ngram", 8, 1.567), ("q4_a8", "edit", "plain", None, None)]]
    cpu = dict(telemetry=dict(cpu_model="Some CPU", cpu_flags="avx512f avx512_vnni"))
    (tmp_path / "spec-cpu-q4-q4_a8.json").write_text(json.dumps(dict(rows=rows, provenance=cpu)))
    assert q4_a8_evidence(tmp_path) == ""  # the quality figure missing: nothing half-said
    quality = [dict(weights="q4", top1_agreement=1.0), dict(weights="q4_a8", top1_agreement=0.9543)]
    (tmp_path / "quality-cpu.json").write_text(json.dumps(dict(rows=quality)))
    q4_a8_evidence.cache_clear()
    said = q4_a8_evidence(tmp_path)
    assert "on Some CPU (avx512f avx512_vnni)" in said and "from 1.23x to 1.57x" in said and "95.4% top-1" in said
    assert f"k={Request().k}" in said


def test_q4_a8_evidence_prefers_this_kind_of_cpus_own_benchmark(tmp_path):
    """Where this kind of CPU has its own spec and quality files (named -<kind>), the clause quotes them and names the
    kind; another kind's files are not read, and a kind with none falls back to the unnamed files."""
    def write(stem, q4, q4_a8, top1, telemetry):
        rows = [dict(target=t, set="edit", temperature=0.0, mode="ngram", k=Request().k, speedup=x)
                for t, x in (("q4", q4), ("q4_a8", q4_a8))]
        (tmp_path / f"spec-cpu-q4-q4_a8{stem}.json").write_text(json.dumps(dict(rows=rows, provenance=dict(
            telemetry=telemetry))))
        (tmp_path / f"quality-cpu{stem}.json").write_text(json.dumps(dict(rows=[dict(weights="q4_a8",
                                                                                    top1_agreement=top1)])))

    write("", 1.11, 1.22, 0.91, dict(cpu_model="Old CPU", cpu_flags="avx2"))
    write("-zen4", 1.86, 2.07, 0.95, dict(cpu_model="AMD EPYC", cpu_kind="zen4", cpu_flags="avx512f avx512_vnni"))
    q4_a8_evidence.cache_clear()
    said = q4_a8_evidence(tmp_path, "zen4")
    assert "on AMD EPYC, zen4 (avx512f avx512_vnni)" in said and "from 1.86x to 2.07x" in said
    assert "(bench/results/spec-cpu-q4-q4_a8-zen4)" in said and "95.0% top-1" in said and "quality-cpu-zen4" in said
    for kind in ("zen5", "sapphire-rapids"):  # kinds with no files of their own
        said = q4_a8_evidence(tmp_path, kind)
        assert "on Old CPU (avx2)" in said and "from 1.11x to 1.22x" in said
        assert "(bench/results/spec-cpu-q4-q4_a8)" in said and "quality-cpu)" in said
