"""The SSE parser and the chunk -> Round assembly, on hand-made streams whose answer is known."""
from __future__ import annotations

import json

import pytest

from engine.endpoint.chunks import parse
from engine.endpoint.errors import EndpointError
from engine.endpoint.metrics import delta
from engine.endpoint.metrics import parse as parse_prom
from engine.endpoint.rounds import RoundBuilder, apply_per_step
from engine.endpoint.servers import SERVERS, lookup
from engine.endpoint.sse import Event, SSEParser
from engine.stats import Stats


def test_sse_events_split_across_reads_keep_the_time_of_their_last_byte():
    p = SSEParser()
    assert p.feed(b'data: {"a"', 1.0) == []
    assert p.feed(b': 1}\r\n', 2.0) == []
    (e,) = p.feed(b"\r\n: a comment\nevent: x\ndata: [DO", 3.0)
    assert (e.data, e.t, e.index) == ('{"a": 1}', 3.0, 0)
    assert p.feed(b"NE]\n\n", 4.0) == [] and p.done


def test_sse_multi_line_data_and_an_unterminated_last_event():
    p = SSEParser()
    assert [e.data for e in p.feed(b"data: 1\ndata: 2\n\n", 0.0)] == ["1\n2"]
    p.feed(b"data: 3", 1.0)
    assert [e.data for e in p.close(2.0)] == ["3"]


def test_sse_size_limit():
    p = SSEParser(max_event_bytes=100)
    with pytest.raises(EndpointError, match="grew past 100 bytes"):
        p.feed(b"data: " + b"x" * 200, 0.0)


def test_lookup_paths_and_alternatives():
    body = {"choices": [{"token_ids": [1, 2]}], "meta_info": {"spec_accepted_drafts": 3}}
    assert lookup(body, "choices.0.token_ids") == [1, 2]
    assert lookup(body, "meta_info.spec_num_correct_drafts|meta_info.spec_accepted_drafts") == 3
    assert lookup(body, "choices.1.x") is None and lookup(None, "a") is None


def llama_chunks(steps, t_gap=10.0):
    """llama-server's chat stream for `steps` [(n tokens, drafted, accepted)], one chunk per token, a step's
    chunks sharing predicted_ms and the draft counters (server-context.cpp:3955-3995)."""
    out, n, d, a, t, clock = [], 0, 0, 0, 0.0, 0.001
    for k, (n_step, drafted, accepted) in enumerate(steps):
        d, a, t = d + drafted, a + accepted, t + t_gap
        clock += 0 if k == 0 else 7.0
        for j in range(n_step):
            n += 1
            timings = dict(prompt_ms=3.0, predicted_n=n, predicted_ms=clock, predicted_per_token_ms=7.0)
            if d:
                timings.update(draft_n=d, draft_n_accepted=a)
            body = {"choices": [{"delta": {"content": f"w{n}"}, "finish_reason": None}], "timings": timings}
            out.append(parse(Event(json.dumps(body), (t + 0.01 * j) / 1e3, len(out)), 0.0, SERVERS["llama-server"]))
    return out


def build(chunks, tokenizer=None):
    b = RoundBuilder(tokenizer)
    rounds = [r for c in chunks for r in b.add(c)] + b.close()
    return rounds, b


def test_llama_server_steps_become_rounds_with_the_servers_kinds():
    steps = [(1, 0, 0), (3, 4, 2), (1, 4, 0), (5, 4, 4), (1, 0, 0)]
    rounds, b = build(llama_chunks(steps))
    assert [len(r.tokens) for r in rounds] == [1, 3, 1, 5, 1]
    assert [t.kind for t in rounds[1].tokens] == ["accepted", "accepted", "resampled"]
    assert [t.kind for t in rounds[2].tokens] == ["resampled"]
    assert [t.kind for t in rounds[3].tokens] == ["accepted"] * 4 + ["bonus"]
    assert [t.kind for t in rounds[4].tokens] == ["target"]
    assert not any(t.inferred for r in rounds for t in r.tokens)
    assert [r.n_drafted for r in rounds] == [0, 4, 4, 4, 0]
    s = Stats(rounds, 5)
    assert s.summary()["acceptance_rate"] == 6 / 12
    assert s.per_position_acceptance() == [2 / 3, 1.0, 1 / 2, 1.0]  # of the drafts that reached each position
    # a step is one gap: its end is its last chunk's arrival, its start the step before's end
    assert rounds[1].t_start_ms == rounds[0].t_end_ms and rounds[1].total_ms == pytest.approx(10.02)
    assert rounds[0].target_ms == 3.0 and rounds[1].target_ms == pytest.approx(7.0)
    assert b.sources["count"] == 11


def test_a_step_cut_short_by_the_end_keeps_its_verified_count():
    rounds, _ = build(llama_chunks([(1, 0, 0), (2, 4, 3)]))
    assert [t.kind for t in rounds[1].tokens] == ["accepted", "accepted"]
    assert rounds[1].n_accepted == 3 and rounds[1].n_drafted == 4


def test_held_back_text_is_two_plain_tokens_in_one_chunk():
    c1 = parse(Event(json.dumps({"choices": [{"delta": {"content": "a"}}], "timings": {
        "predicted_n": 1, "predicted_ms": 0.001}}), 0.01, 0), 0.0, SERVERS["llama-server"])
    c2 = parse(Event(json.dumps({"choices": [{"delta": {"content": "bc"}}], "timings": {
        "predicted_n": 3, "predicted_ms": 14.0}}), 0.03, 1), 0.0, SERVERS["llama-server"])
    rounds, _ = build([c1, c2])
    assert [t.kind for t in rounds[1].tokens] == ["target", "target"]
    assert [t.text for t in rounds[1].tokens] == ["bc", ""]


def openai_chunk(text, i, t_ms, ids=None):
    body = {"choices": [{"delta": {"content": text}, **({"token_ids": ids} if ids else {})}]}
    return parse(Event(json.dumps(body), t_ms / 1e3, i), 0.0, SERVERS["vllm"])


def test_multi_token_chunks_without_counters_are_inferred():
    rounds, b = build([openai_chunk("a", 0, 5, [1]), openai_chunk("bcd", 1, 15, [2, 3, 4])])
    assert [t.kind for t in rounds[1].tokens] == ["accepted", "accepted", "target"]
    assert all(t.inferred for t in rounds[1].tokens) and rounds[1].n_drafted == 0
    assert Stats(rounds, 1).summary()["acceptance_rate"] != Stats(rounds, 1).summary()["acceptance_rate"]  # NaN
    assert [t.token_id for t in rounds[1].tokens] == [2, 3, 4] and b.sources["ids"] == 4


def test_vllm_per_step_arrays_label_the_rounds_where_they_line_up():
    rounds, _ = build([openai_chunk("a", 0, 5, [1]), openai_chunk("bcd", 1, 15, [2, 3, 4]),
                       openai_chunk("e", 2, 25, [5])])
    assert not apply_per_step(rounds, [2], [3])  # one step short: left inferred
    assert apply_per_step(rounds, [2, 0], [3, 3])
    assert [t.kind for t in rounds[1].tokens] == ["accepted", "accepted", "resampled"]
    assert [t.kind for t in rounds[2].tokens] == ["resampled"]
    assert Stats(rounds, 1).summary()["acceptance_rate"] == 2 / 6


def test_retokenized_when_the_server_gives_no_count():
    class Words:
        def encode(self, text):
            return text.split()

    chunks = [parse(Event(json.dumps({"choices": [{"delta": {"content": t}}]}), i / 100, i), 0.0, SERVERS["openai"])
              for i, t in enumerate(["one", " two three", " four"])]
    rounds, b = build(chunks, Words())
    assert [len(r.tokens) for r in rounds] == [1, 2, 1] and b.sources["retokenized"] == 4
    rounds, b = build(chunks)
    assert [len(r.tokens) for r in rounds] == [1, 1, 1] and b.sources["chunks"] == 3


def test_prometheus_counters_and_their_deltas():
    text = ('# HELP x\nvllm:spec_decode_num_drafts_total{model_name="m"} 10.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 7.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 3.0\n')
    names = SERVERS["vllm"].prometheus
    before = parse_prom(text, names)
    after = parse_prom(text.replace("10.0", "14.0").replace("} 3.0", "} 5.0"), names)
    assert before == {"drafts": 10.0, "accepted_per_pos": [7.0, 3.0]}
    assert delta(before, after) == {"drafts": 4, "accepted_per_pos": [0, 2]}
