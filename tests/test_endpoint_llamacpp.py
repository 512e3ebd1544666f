"""The client against a real llama-server (LLAMA_SERVER; scripts/build_llamacpp.sh builds it) on the default
model's GGUF, plain and with its n-gram lookup drafting; each server is stopped after its tests, pass or fail."""
from __future__ import annotations

import time

import pytest

from engine.endpoint import Endpoint, endpoint_stats, stream
from engine.endpoint.llamacpp import LlamaServer, binary, missing_reason

pytestmark = pytest.mark.skipif(binary() is None, reason=missing_reason())
QUOTE = ("Repeat the following text exactly: The old lighthouse stood at the edge of the cliff. Every night its "
         "lamp turned slowly, sweeping the dark water with a long beam of light.")


def server(spec=()):
    from engine.checkpoint.default_model import gguf_path

    # one thread: on a shared 2-core machine llama.cpp's spinning OpenMP threads stall each other
    with LlamaServer(gguf_path(), threads=1, ctx=1024, spec=list(spec)) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain():
    yield from server()


@pytest.fixture(scope="module")
def ngram():
    yield from server(["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"])


def run(srv, prompt, n=24, **kw):
    s = stream(Endpoint(srv.url), prompt, max_new_tokens=n, **kw)
    rounds = list(s)
    return rounds, s, endpoint_stats(rounds, s.info)


def test_plain_run_counts_and_clocks(plain):
    rounds, s, stats = run(plain, "The capital of France is", chat=False, extra={"ignore_eos": True})
    info = s.info
    assert info.server == "llama-server" and info.server_version == plain.props()["build_info"]
    assert len(stats.ids) == 24 == info.completion_tokens and info.stop_reason == "length"
    assert {t.kind for r in rounds for t in r.tokens} == {"target"} and rounds[-1].finished
    assert info.server_ms_per_token > 0 and info.prompt_tokens == stats.prompt_len > 0
    # the client's gaps cannot be shorter than the server's steps: its clock starts before the server's
    assert stats.summary()["itl_mean_ms"] > 0.5 * info.server_ms_per_token


def test_ngram_acceptance_is_the_servers(ngram):
    rounds, s, stats = run(ngram, QUOTE, n=40, chat=True)
    info = s.info
    assert info.server_drafted and info.kinds_from == "the server, per step"
    assert stats.summary()["acceptance_rate"] == info.server_accepted / info.server_drafted
    assert any(len(r.emitted) > 1 for r in rounds)


def test_stop_mid_stream_frees_the_server(plain):
    got = []
    s = stream(Endpoint(plain.url), "Count from one to a hundred:", chat=False, max_new_tokens=200,
               cancelled=lambda: len(got) >= 3, extra={"ignore_eos": True})
    for r in s:
        got.append(r)
    assert s.stopped and len(got) in (3, 4)  # the step in flight when Stop came is kept
    t = time.perf_counter()  # the server's one slot is free again: the next run starts at once
    rounds, _, _ = run(plain, "Hi", n=2, chat=False)
    assert len(rounds) >= 1 and rounds[0].t_end_ms < (time.perf_counter() - t) * 1e3 + 1
