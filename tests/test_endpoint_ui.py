"""The endpoint backend on the page, through the callbacks: a run streams and records like ours (backend column,
CSVs, trace), the key reaches no table, file, message or log whatever the server echoes, the launch key goes only
to launch endpoints, a failed endpoint is a message and a failed record, and Compare puts this engine beside the
endpoint. The queue's behaviour, through gradio itself, is in test_endpoint_queue.py."""
from __future__ import annotations

import csv
import json
import logging

import gradio as gr
import pytest

from ui.models import Runtimes
from ui import callbacks, compare, endpoint
from ui.run import Session, parse_settings
from ui.testing import tiny_settings
from engine.cli import main as cli_main
from tests.endpoint_fake import ECHOES, FakeServer, chunk, echoing, echoing_gets, sse

KEY = "sk-ui-4c2d8e71f0"
EVENTS = [chunk(None), chunk("Hello"), chunk(" wor"), chunk("ld", finish="stop"),
          {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}]


@pytest.fixture(scope="module")
def rt(tiny_runtime):
    return tiny_runtime


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


def outputs_of(rt, session, url) -> str:
    """Everything a run shows or writes: its page updates (or the error an API client gets), the figures, the runs
    table, every file, the session's records."""
    try:
        seen = [repr(run(rt, session, url))]
    except gr.Error as e:
        seen = [str(e), repr(e)]
    last = callbacks.last_run(rt, session)
    seen += [x.to_json() if hasattr(x, "to_json") else repr(x) for x in last]
    if session.last is not None:
        seen.append(files_text(session))
    seen += [repr(session.history), repr(rt)]
    return "\n".join(seen)


def test_a_server_echoing_the_launch_key_everywhere_leaks_it_nowhere(rt, caplog, capsys, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("DS_TEST_KEY", KEY)
    rt.endpoint_key, seen = KEY, []
    try:
        for where in ECHOES:
            with FakeServer(echoing(where), extra_get=echoing_gets()) as fake:
                rt.endpoints = [fake.url]
                seen.append(outputs_of(rt, Session(), fake.url))  # the model from /v1/models, the server probed
                cli_main(["--endpoint", fake.url, "--api-key-env", "DS_TEST_KEY", "-p", "hi", "-n", "4"])
                assert all(r["headers"]["Authorization"] == f"Bearer {KEY}" for r in fake.requests)
    finally:
        rt.endpoint_key = None
    seen.append(caplog.text + "".join(capsys.readouterr()))
    text = "\n".join(seen)
    fragments = [f for n in range(6, len(KEY) + 1) for f in (KEY[:n], KEY[-n:]) if f in text]
    assert not fragments and "<api key>" in text


def test_the_launch_key_goes_only_to_launch_endpoints(rt):
    rt.endpoint_key, rt.allow_any_endpoint = KEY, True
    try:
        with FakeServer(sse(EVENTS)) as listed, FakeServer(sse(EVENTS)) as typed:
            rt.endpoints = [listed.url]
            run(rt, Session(), typed.url)  # a visitor's own address: no key of the operator's
            assert typed.requests and all("Authorization" not in r["headers"] for r in typed.requests + typed.gets)
            mine = Session()
            endpoint.set_key(mine, "sk-visitor-own")
            run(rt, mine, typed.url)
            assert typed.requests[-1]["headers"]["Authorization"] == "Bearer sk-visitor-own"
            # the listed endpoint, spelled another way, is still the listed one and gets the launch key
            run(rt, Session(), listed.url.replace("http://", "HTTP://") + "/")
            assert listed.requests[-1]["headers"]["Authorization"] == f"Bearer {KEY}"
    finally:
        rt.endpoint_key, rt.allow_any_endpoint = None, False


def test_a_refusal_lists_the_endpoints_the_app_allows(rt):
    rt.endpoints = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    with pytest.raises(gr.Error, match=r"pick one of the list \(http://127.0.0.1:9/v1, http://127.0.0.1:10/v1\)"):
        run(rt, Session(), "http://127.0.0.1:11/v1")


def test_text_a_spreadsheet_would_run_is_quoted_in_both_csvs(rt):
    events = [chunk("=HYPERLINK(\"http://x\")"), chunk("@SUM(1)"), chunk(None, finish="stop")]
    with FakeServer(sse(events)) as fake:
        rt.endpoints = [fake.url]
        session = Session()
        run(rt, session, fake.url, endpoint_model="=cmd|' /C calc'!A0")
    _, (tokens_csv, _, runs_csv) = session.last
    cells = [c for path in (tokens_csv, runs_csv) for row in csv.reader(open(path, encoding="utf-8")) for c in row]
    def number(c):
        try:
            return float(c) == float(c)
        except ValueError:
            return False

    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r") and not number(c)]
    assert "'=cmd|' /C calc'!A0" in cells and any(c.startswith("'=HYPERLINK") for c in cells)
