"""Every way a serving engine can misbehave, each against a local server that misbehaves that way: each ends
the run with a message that says what happened and what to do, keeps what had arrived, and leaves no connection open."""
from __future__ import annotations

import json
import re
import time

import pytest

from engine.endpoint import Endpoint, stream
from tests.endpoint_fake import FakeServer, collect, chunk, free_port, slow_stream, sse, stall_after, status

KEY = "sk-test-5e1f0c9a"


def run(url: str, stall_s: float = 5.0, key: str | None = None, **kw):
    """(rounds, the stream, the EndpointError or None)."""
    return collect(Endpoint(url, model="m", server="openai", api_key=key, stall_s=stall_s), **kw)


def test_a_well_behaved_stream_is_one_round_per_chunk():
    events = [chunk(None), chunk("Hello"), chunk(" world"), chunk(None, finish="stop"),
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}]
    with FakeServer(sse(events, gap_s=0.01)) as fake:
        rounds, s, err = run(fake.url, key=KEY)
    assert err is None
    assert [t.text for r in rounds for t in r.tokens] == ["Hello", " world"]
    assert rounds[-1].finished and s.info.stop_reason == "stop" and s.info.prompt_tokens == 5
    assert rounds[1].t_start_ms == rounds[0].t_end_ms > 0
    req = fake.requests[0]
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["body"]["stream"] is True and req["body"]["stream_options"] == {"include_usage": True}
    assert req["body"]["messages"] == [{"role": "user", "content": "hi"}]


def test_unreachable_address():
    rounds, _, err = run(f"http://127.0.0.1:{free_port()}/v1")
    assert err is not None and "cannot connect" in str(err) and "is the server running" in str(err)
    assert rounds == [] and not err.partial


def test_wrong_path_names_the_base_url():
    with FakeServer(sse([])) as fake:
        _, _, err = run(fake.url.replace("/v1", "/wrong"))
    assert err is not None and err.status == 404 and "no route /wrong/chat/completions" in str(err)
    assert "check the base URL" in str(err)


@pytest.mark.parametrize("code, hint", [(401, "API key"), (404, "base URL"), (429, "rate limiting"),
                                        (500, "the server failed")])
def test_http_errors_carry_their_body_and_a_hint_and_never_the_key(code, hint):
    body = json.dumps({"error": {"message": f"refused (you sent Bearer {KEY})"}})
    with FakeServer(status(code, body)) as fake:
        _, _, err = run(fake.url, key=KEY)
    assert err is not None and err.status == code and str(code) in str(err) and hint in str(err)
    assert "refused (you sent Bearer <api key>)" in str(err)
    assert KEY not in str(err)


def test_a_reply_that_is_not_an_event_stream():
    with FakeServer(status(200, json.dumps({"choices": [{"message": {"content": "hi"}}]}))) as fake:
        _, _, err = run(fake.url)
    assert err is not None and "not an event stream" in str(err) and "application/json" in str(err)


def test_a_malformed_json_chunk_keeps_what_came_before():
    with FakeServer(sse([chunk("a"), chunk("b"), "{not json"])) as fake:
        rounds, s, err = run(fake.url)
    assert err is not None and "chunk 2 is not JSON" in str(err) and err.partial
    assert [t.text for r in rounds for t in r.tokens] == ["a", "b"]
    assert not rounds[-1].finished and s.info.failed == str(err)


def test_an_error_object_mid_stream():
    with FakeServer(sse([chunk("a"), {"error": {"message": "out of KV cache"}}])) as fake:
        rounds, _, err = run(fake.url)
    assert err is not None and "out of KV cache" in str(err) and len(rounds) == 1


def test_a_server_that_stalls_mid_stream_is_cut_off_and_the_partial_run_kept():
    holder = []
    with FakeServer(stall_after([chunk("a"), chunk("b")], holder)) as fake:
        holder.append(fake)
        t = time.perf_counter()
        rounds, _, err = run(fake.url, stall_s=0.5)
        took = time.perf_counter() - t
        assert fake.client_left.wait(3), "the client kept the stalled connection open"
    assert err is not None and "sent nothing for 0.5 s" in str(err) and err.partial
    assert "the 2 tokens that arrived are kept" in str(err)
    assert len(rounds) == 2 and not rounds[-1].finished
    assert took < 3


def test_a_server_that_closes_before_finishing():
    def one_then_close(h, body):
        from tests.endpoint_fake import start_sse, write_event
        start_sse(h)
        write_event(h, chunk("a"))

    with FakeServer(one_then_close) as fake:
        rounds, _, err = run(fake.url)
    assert err is not None and "closed the stream before the run finished" in str(err) and len(rounds) == 1


def test_stop_mid_stream_closes_the_connection():
    holder = []
    with FakeServer(slow_stream(holder, gap_s=0.03)) as fake:
        holder.append(fake)
        got = []
        s = stream(Endpoint(fake.url, model="m", server="openai"), "hi", cancelled=lambda: len(got) >= 3)
        for r in s:
            got.append(r)
        assert fake.client_left.wait(3), "Stop did not close the connection"
    assert s.stopped and len(got) == 3 and not got[-1].finished


def test_a_chunk_over_the_size_limit():
    with FakeServer(sse([chunk("a"), chunk("x" * (2 << 20))])) as fake:
        rounds, _, err = run(fake.url)
    assert err is not None and "grew past 1048576 bytes" in str(err) and len(rounds) == 1


def test_stop_while_the_server_has_not_answered_yet_returns_at_once():
    holder = []
    with FakeServer(stall_after([], holder)) as fake:
        holder.append(fake)
        t = time.perf_counter()
        s = stream(Endpoint(fake.url, model="m", server="openai", stall_s=30),
                   "hi", cancelled=lambda: time.perf_counter() - t > 0.3)
        assert list(s) == []
        assert time.perf_counter() - t < 2 and s.stopped


def test_bad_urls_fail_at_the_boundary():
    for url, msg in (("ftp://x/v1", "not an http(s) URL"), ("http://u:p@host/v1", "carries credentials"),
                     ("http://host/v1?x=1", "query"), ("", "not an http(s) URL")):
        with pytest.raises(ValueError, match=re.escape(msg)):
            Endpoint(url)
    assert Endpoint("http://127.0.0.1:8080").url == "http://127.0.0.1:8080/v1"
    assert KEY not in repr(Endpoint("http://h/v1", api_key=KEY))
