"""The endpoint client against a hostile or broken server: the key reaches no message or setting whatever the
server echoes; what a server reports is bounded by what arrived; a malformed reply ends the run as failed with
its tokens kept (EndpointError, never another exception); every request is bounded in bytes and time, and a
Stop ends a run within half a second in any phase."""
from __future__ import annotations

import json
import threading
import time

import pytest

from engine.endpoint import Endpoint, endpoint_stats, stream
from engine.endpoint.errors import REDACTED, redact
from engine.stats import Round, Stats, Token
from tests.endpoint_fake import collect as run
from tests.endpoint_fake import (ECHOES, FakeServer, chunk, echoing, echoing_gets, sse, start_sse, status,
                                 stall_after, write_event)

KEY = "sk-hostile-7d41c09be2aa"
STOP_S = 0.5


def leaks(text: str, key: str = KEY) -> list[str]:
    """The key, or a prefix or suffix of it of 6 characters or more, wherever it is in text."""
    return [f for n in range(6, len(key) + 1) for f in (key[:n], key[-n:]) if f in text]


def test_redact_removes_the_key_and_what_a_cut_leaves_of_it():
    assert redact(f"a {KEY} b {KEY}", KEY) == f"a {REDACTED} b {REDACTED}"
    assert redact(f"cut here {KEY[:9]}", KEY) == f"cut here {REDACTED}"
    assert redact(f"{KEY[-7:]} from the start", KEY) == f"{REDACTED} from the start"
    assert redact("ordinary text ending in sk", KEY) == "ordinary text ending in sk"  # under MIN_FRAGMENT
    assert redact("x", None) == "x"


@pytest.mark.parametrize("where", ECHOES)
def test_a_server_echoing_the_key_leaks_it_into_no_message_or_setting(where):
    with FakeServer(echoing(where), extra_get=echoing_gets()) as fake:
        rounds, s, err = run(Endpoint(fake.url, server="llama-server", api_key=KEY))
        assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"  # it did get the key to echo
    stats = endpoint_stats(rounds, s.info, {})
    seen = " ".join([str(err), repr(err), repr(s.info), json.dumps(stats.settings, default=str),
                     json.dumps(stats.rows(), default=str)])
    assert not leaks(seen), (where, leaks(seen))
    assert REDACTED in seen  # what was echoed is there, scrubbed


def llama_chunk(text: str, **timings) -> dict:
    return {"choices": [{"delta": {"content": text}, "finish_reason": None}], "timings": timings}


def test_one_small_chunk_that_claims_200000_tokens_costs_what_its_bytes_allow():
    events = [llama_chunk("x", predicted_n=200000, predicted_ms=2)]
    with FakeServer(sse(events)) as fake:
        t = time.perf_counter()
        rounds, s, err = run(Endpoint(fake.url, model="m", server="llama-server"), max_new_tokens=16)
        stats = endpoint_stats(rounds, s.info, {})
        stats.summary(), stats.rows()
        took = time.perf_counter() - t
    assert sum(len(r.tokens) for r in rounds) <= 16 and took < 1.0


def test_rendering_and_stats_are_linear_in_a_rounds_tokens():
    from ui import render

    n = 20_000  # n * n steps would take minutes; linear work took 0.6 s here, 1.2 s with a build beside it
    rnd = Round(1, [Token(-1, "target", text="x") for _ in range(n)], 0.0, 5.0)
    stats = Stats([Round(0, [Token(-1, "target", text="a")], 0.0, 1.0), rnd], 1)
    t = time.perf_counter()
    stats.summary(), stats.rows(), render.render_rounds(stats.rounds, str)
    assert time.perf_counter() - t < 10.0


@pytest.mark.parametrize("name, raw, says", [
    ("deep nesting", "[" * 100_000, "nests deeper"),
    ("5000 digits", '{"choices": [], "timings": {"predicted_n": ' + "9" * 5000 + "}}", "digits"),
    ("Infinity", '{"choices": [{"delta": {"content": "b"}}], "timings": {"predicted_n": Infinity}}', "Infinity"),
    ("huge float", '{"choices": [{"delta": {"content": "b"}}], "timings": {"predicted_ms": 1e400}}', "too large"),
    ("negative drafts", json.dumps(llama_chunk("b", predicted_n=2, predicted_ms=4, draft_n=-5, draft_n_accepted=7)),
     "is not a count"),
])
def test_a_malformed_chunk_ends_the_run_as_failed_with_its_tokens_kept(name, raw, says):
    events = [llama_chunk("a", predicted_n=1, predicted_ms=1), raw]
    with FakeServer(sse(events)) as fake:
        rounds, s, err = run(Endpoint(fake.url, model="m", server="llama-server"))
    assert err is not None and says in str(err), (name, err)
    assert [t.text for r in rounds for t in r.tokens] == ["a"] and s.info.failed == str(err)


def test_accepted_past_drafted_is_clamped_not_a_crash():
    events = [llama_chunk("a", predicted_n=1, predicted_ms=1),
              llama_chunk("b", predicted_n=2, predicted_ms=4, draft_n=3, draft_n_accepted=7), chunk(None, "stop")]
    with FakeServer(sse(events)) as fake:
        rounds, s, err = run(Endpoint(fake.url, model="m", server="llama-server"))
    assert err is None and rounds[1].n_drafted == 3 and rounds[1].n_accepted <= 3


def test_invalid_utf8_after_good_events_in_the_same_read_keeps_them():
    def behaviour(h, body):
        start_sse(h)
        good = b"".join(f"data: {json.dumps(chunk(t))}\n\n".encode() for t in ("a", "b"))
        h.wfile.write(good + b"data: {\"x\": \"\xff\xfe\"}\n\n")
        h.wfile.flush()

    with FakeServer(behaviour) as fake:
        rounds, _, err = run(Endpoint(fake.url, model="m", server="openai"))
    assert err is not None and "not UTF-8" in str(err)
    assert [t.text for r in rounds for t in r.tokens] == ["a", "b"]


def test_a_server_that_ignores_max_tokens_is_read_up_to_it():
    events = [chunk(f"t{i}") for i in range(500)]
    with FakeServer(sse(events)) as fake:
        rounds, s, err = run(Endpoint(fake.url, model="m", server="openai"), max_new_tokens=16)
    assert err is None and sum(len(r.tokens) for r in rounds) == 16 and rounds[-1].finished
    assert s.info.stop_reason == "length" and "stopped reading" in s.info.note


def test_keep_alive_comments_do_not_hold_a_run_past_its_deadline():
    def comments(h, body):
        start_sse(h)
        write_event(h, chunk("a"))
        t = time.monotonic()
        while time.monotonic() - t < 8:
            h.wfile.write(b": keep-alive\n\n")
            h.wfile.flush()
            time.sleep(0.05)

    with FakeServer(comments) as fake:
        t = time.perf_counter()
        rounds, _, err = run(Endpoint(fake.url, model="m", server="openai", stall_s=0.3), max_new_tokens=1)
        took = time.perf_counter() - t
    assert err is not None and "deadline" in str(err) and len(rounds) == 1 and took < 4


def test_a_huge_model_list_is_read_only_up_to_its_cap():
    def flood(h, _):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(b'{"data": [{"id": "m"}' + b", 1" * (4 << 20) + b"]}")

    with FakeServer(sse([chunk("a", finish="stop")]), extra_get={"/v1/models": flood}) as fake:
        _, _, err = run(Endpoint(fake.url, server="openai"))
    assert err is not None and "lists none" in str(err)  # a capped answer is no answer, and nothing hangs


def test_a_redirect_on_the_model_list_says_it_redirected():
    def redirect(h, _):
        h.send_response(302)
        h.send_header("Location", "http://169.254.169.254/")
        h.send_header("Content-Length", "0")
        h.end_headers()

    with FakeServer(sse([]), extra_get={"/v1/models": redirect}) as fake:
        _, _, err = run(Endpoint(fake.url, server="openai"))
    assert err is not None and "redirected (302)" in str(err)


@pytest.mark.parametrize("phase", ["probe", "model list", "answer", "stream"])
def test_stop_ends_a_run_within_half_a_second_in_any_phase(phase):
    holder = []
    hold = stall_after([chunk("a")] if phase == "stream" else [], holder)

    def stall_get(h, _):
        t = time.monotonic()
        while time.monotonic() - t < 8 and not holder[0].release.is_set():
            time.sleep(0.02)

    gets = {"probe": {"/props": stall_get}, "model list": {"/v1/models": stall_get}}.get(phase, {})
    with FakeServer(hold, extra_get=gets) as fake:
        holder.append(fake)
        stop_at = [None]

        def watch():  # Stop 0.2 s after the server saw the phase's request, whatever the client is doing
            t = time.monotonic()
            while not (fake.gets or fake.requests) and time.monotonic() - t < 10:
                time.sleep(0.005)
            stop_at[0] = time.perf_counter() + 0.2

        threading.Thread(target=watch, daemon=True).start()

        def cancelled():
            return stop_at[0] is not None and time.perf_counter() > stop_at[0]

        ep = Endpoint(fake.url, model="" if phase == "model list" else "m",
                      server="llama-server" if phase == "probe" else "openai", stall_s=30)
        s = stream(ep, "hi", cancelled=cancelled)
        list(s)
        assert s.stopped and time.perf_counter() - stop_at[0] < STOP_S, phase


def test_http_error_status_is_named(tmp_path):
    with FakeServer(status(503, "")) as fake:
        _, _, err = run(Endpoint(fake.url, model="m", server="openai"))
    assert err is not None and "503" in str(err) and "empty body" in str(err)


def test_no_rate_over_an_interval_the_clock_cannot_resolve():
    """Chunks of one read are stamped microseconds apart: their tok/s is no figure (it was 1104606.2)."""
    rounds = [Round(0, [Token(-1, "target", text="a")], 0.0, 5.0),
              Round(1, [Token(-1, "target", text="b")], 5.0, 5.000_9)]
    assert Stats(rounds, 1).summary()["decode_tok_s"] != Stats(rounds, 1).summary()["decode_tok_s"]  # NaN
    rounds[1].t_end_ms = 7.0
    assert Stats(rounds, 1).summary()["decode_tok_s"] == pytest.approx(500.0)
