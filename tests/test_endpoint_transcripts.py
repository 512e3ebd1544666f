"""Recorded SSE transcripts (tests/data/*.jsonl) replayed by a local server through the real client: the
llama-server ones recorded from a real run of the binary scripts/build_llamacpp.sh builds (the version is in each
file's header), the vLLM and SGLang ones made by hand from those projects' documented shapes (each file says so)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.endpoint import Endpoint, endpoint_stats, extra_summary, stream
from engine.endpoint.transcript import load
from tests.endpoint_fake import FakeServer, replay

DATA = Path(__file__).parent / "data"


def run_transcript(name: str, tokenizer=None):
    header, reads = load(DATA / name)
    probes = {"/props": {"build_info": header["server_version"]}} if header["server"] == "llama-server" else {}
    with FakeServer(replay(reads, within_s=1.5), extra_get=probes) as fake:
        s = stream(Endpoint(fake.url, model="m", server=header["server"]), "x", tokenizer=tokenizer)
        rounds = list(s)
    return header, rounds, s.info


def test_vllm_detailed_metrics_label_every_step():
    header, rounds, info = run_transcript("vllm-spec-detailed.jsonl")
    want = header["expect"]
    stats = endpoint_stats(rounds, info)
    assert len(stats.ids) == want["tokens"] == info.completion_tokens
    assert info.tokens_from == "the server's token count" and info.kinds_from == "the server's per-step arrays"
    assert [r.n_drafted for r in rounds[1:]] == want["per_step_drafted"]
    assert [r.n_accepted for r in rounds[1:]] == want["per_step_accepted"]
    acc, drafted = sum(want["per_step_accepted"]), sum(want["per_step_drafted"])
    assert stats.summary()["acceptance_rate"] == acc / drafted == info.server_acceptance
    assert not any(t.inferred for r in rounds for t in r.tokens)
    assert rounds[-1].finished and info.stop_reason == "stop"
    assert stats.settings["backend"] == "endpoint" and stats.settings["server"] == "vllm"


def test_sglang_chunks_without_counters_are_inferred_and_say_so():
    header, rounds, info = run_transcript("sglang-spec-chat.jsonl")
    assert [len(r.tokens) for r in rounds] == [1] * len(header["expect"]["chunks_per_step"])  # no count: a chunk each
    assert info.tokens_from.startswith("one token per chunk") and info.completion_tokens == header["expect"]["tokens"]

    class Pieces:  # the transcript's own word pieces: re-tokenization recovers the steps
        def encode(self, text):
            return re.findall(r" ?[^ .]+|\.", text)

    _, rounds, info = run_transcript("sglang-spec-chat.jsonl", Pieces())
    assert [len(r.tokens) for r in rounds] == header["expect"]["chunks_per_step"]
    assert info.tokens_from == "re-tokenized with the app's tokenizer"
    assert info.kinds_from == "inferred from tokens per chunk"
    assert all(t.inferred for r in rounds if len(r.tokens) > 1 for t in r.tokens)
    x = extra_summary(endpoint_stats(rounds, info), info)
    assert x["tokens_per_chunk"] == pytest.approx(header["expect"]["tokens"] / len(rounds))


@pytest.mark.parametrize("name", ["llama-server-plain.jsonl", "llama-server-ngram.jsonl"])
def test_recorded_llama_server_runs(name):
    header, rounds, info = run_transcript(name)
    want = header["expect"]
    assert header["server_version"].startswith("b") and info.server_version == header["server_version"]
    stats = endpoint_stats(rounds, info)
    assert len(stats.ids) == want["tokens"] == info.completion_tokens == want["completion_tokens"]
    assert info.tokens_from == "the server's token count" and rounds[-1].finished
    assert info.server_ms_per_token == want["predicted_per_token_ms"]
    if want["draft_n"]:
        # the client's acceptance, from its Rounds, is the server's draft_n_accepted / draft_n exactly
        assert stats.summary()["acceptance_rate"] == want["draft_n_accepted"] / want["draft_n"]
        assert sum(r.n_drafted for r in rounds) == want["draft_n"] and info.kinds_from == "the server, per step"
        assert any(len(r.emitted) > 1 for r in rounds)
    else:
        assert {t.kind for r in rounds for t in r.tokens} == {"target"} and len(rounds) == want["tokens"]
    text = "".join(t.text for r in rounds for t in r.tokens)
    assert text.strip() and all(r.total_ms >= 0 for r in rounds)
    # the client's own cost per chunk, in wall time and in the consuming thread's CPU time (never more than wall)
    assert info.chunks >= len(rounds) and 0 < info.client_cpu_ms <= info.client_ms + 0.05
    assert info.client_cpu_ms_per_chunk == info.client_cpu_ms / info.chunks
    # and the reader thread's HTTP reads, which the total per chunk adds to the parsing
    assert info.read_cpu_ms > 0
    assert info.client_total_cpu_ms_per_chunk == pytest.approx((info.read_cpu_ms + info.client_cpu_ms) / info.chunks)
