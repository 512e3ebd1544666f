"""The endpoint backend on the page, through the callbacks: a run streams and records like ours (backend column,
CSVs, trace), the key reaches no table, file, message or log, only launch endpoints are accepted, a failed or
stalled endpoint leaves the engine free for other users, and Compare puts this engine beside the endpoint."""
from __future__ import annotations

import csv
import json
import logging
import threading
import time

import gradio as gr
import pytest

from ui.models import Runtimes
from ui import callbacks, compare, endpoint
from ui import run as ui_run
from ui.run import Session, parse_settings
from ui.startup import build_runtime
from ui.testing import tiny_settings
from tests.endpoint_fake import FakeServer, chunk, sse, stall_after

KEY = "sk-ui-4c2d8e71f0"
EVENTS = [chunk(None), chunk("Hello"), chunk(" wor"), chunk("ld", finish="stop"),
          {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}]


@pytest.fixture(scope="module")
def rt():
    rt = build_runtime(tiny=True, device="cpu", bandwidth=False, progress=lambda *a: None)
    yield rt
    rt.close()


def values(url, **kw):
    return tiny_settings(**{"backend": endpoint.ENDPOINT, "endpoint": url, "endpoint_model": "m",
                            "server": "openai", "max_new_tokens": 8, **kw})


def run(rt, session, url, **kw):
    return list(callbacks.generate(Runtimes(rt), session, "hi", **values(url, **kw)))


def files_text(session) -> str:
    _, files = session.last
    return "".join(open(f, encoding="utf-8").read() for f in files)


def test_an_endpoint_run_streams_records_and_exports_without_the_key(rt, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    rt.endpoints = []
    with FakeServer(sse(EVENTS, gap_s=0.01)) as fake:
        rt.endpoints = [fake.url]
        session = Session()
        endpoint.set_key(session, KEY)
        outs = run(rt, session, fake.url)
        assert fake.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    html, stats_html, status = outs[-1]
    assert "Hello" in html and "ld" in html and "Run 1 done: endpoint" in status and "ITL per chunk" in status
    stats, (tokens_csv, trace, runs_csv) = session.last
    assert stats.settings["backend"] == "endpoint" and stats.settings["endpoint_model"] == "m"
    rows = list(csv.DictReader(open(tokens_csv, encoding="utf-8")))
    # no count from this server: the app's (tiny) tokenizer splits the chunks; the text is the server's
    assert "".join(r["token_text"] for r in rows) == "Hello world" and rows[0]["token_text"] == "Hello"
    assert rows[0]["backend"] == "endpoint" and stats.settings["tokens_from"].startswith("re-tokenized")
    assert list(csv.DictReader(open(runs_csv, encoding="utf-8")))[0]["backend"] == "endpoint"
    assert json.load(open(trace))["otherData"]["backend"] == "endpoint"
    logged = caplog.text + "".join(capsys.readouterr())
    for where in (files_text(session), repr(stats.settings), repr(session.history), html + stats_html + status,
                  logged, repr(rt)):
        assert KEY not in where
    figs = callbacks.last_run(rt, session)
    assert len(figs) == 7


def test_only_launch_endpoints_unless_any_is_allowed(rt):
    rt.endpoints, rt.allow_any_endpoint = ["http://127.0.0.1:9/v1"], False
    with pytest.raises(gr.Error, match="not one the app was started with"):
        run(rt, Session(), "http://169.254.169.254/v1")
    with pytest.raises(gr.Error, match="not an http"):
        rt.allow_any_endpoint = True
        run(rt, Session(), "file:///etc/passwd")
    rt.allow_any_endpoint = False


def test_a_failed_endpoint_is_a_message_and_a_failed_record(rt):
    with FakeServer(sse([chunk("a"), "{broken"])) as fake:
        rt.endpoints = [fake.url]
        session = Session()
        outs = run(rt, session, fake.url)
    assert "Run 1 failed: chunk 1 is not JSON" in outs[-1][2]
    assert session.history[-1].stopped and session.history[-1].label.endswith("(failed)")
    with FakeServer(sse([])) as fake:  # nothing arrived: a plain error, nothing recorded
        rt.endpoints = [fake.url.replace("/v1", "/nope")]
        with pytest.raises(gr.Error, match="404"):
            run(rt, Session(), rt.endpoints[0])


def test_a_stalled_endpoint_leaves_the_engine_to_other_users(rt):
    holder = []
    with FakeServer(stall_after([chunk("a")], holder)) as fake:
        holder.append(fake)
        rt.endpoints, rt.endpoint_stall_s = [fake.url], 30.0
        stalled = Session()
        gen = callbacks.generate(Runtimes(rt), stalled, "hi", **values(fake.url))
        next(gen), next(gen)  # the run started, its first chunk came: it holds its connection
        done = threading.Event()

        def other_user():
            list(callbacks.generate(Runtimes(rt), Session(), "the cat", **tiny_settings(max_new_tokens=4)))
            done.set()

        threading.Thread(target=other_user, daemon=True).start()
        assert done.wait(60), "an engine run waited on a stalled endpoint"
        ui_run.stop(stalled)  # Stop: the connection closes, the run is recorded as stopped
        t = time.perf_counter()
        outs = list(gen)
        assert time.perf_counter() - t < 5 and "stopped" in outs[-1][2]
        assert fake.client_left.wait(3)


def test_compare_runs_this_engine_and_the_endpoint(rt):
    with FakeServer(sse(EVENTS, gap_s=0.01)) as fake:
        rt.endpoints = [fake.url]
        session = Session()
        s = parse_settings(values(fake.url))
        planned = compare.plan(rt, s)
        assert [(g, b) for g, _, _, _, b in planned] == [("backend", True), ("backend", False)]
        list(compare.compare(Runtimes(rt), session, "hi", **values(fake.url)))
    entries = session.last_compare
    assert [e.group for e in entries] == ["backend", "backend"] and all(e.stats for e in entries)
    assert entries[0].stats.settings["backend"] == "engine" and entries[1].stats.settings["backend"] == "endpoint"
    fig, table, runs, _ = compare.last_compare(rt, session)
    assert len(table) == 2 and table[1][5] is not None  # the endpoint's speedup over this engine
