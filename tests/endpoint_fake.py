"""A local OpenAI-compatible server that misbehaves on request, for the endpoint client's tests.

FakeServer(behaviour) serves POST /v1/chat/completions and /v1/completions with behaviour(handler, body), on
127.0.0.1 and a free port, in a thread; it records the requests (headers and JSON) and whether a client went
away mid-stream. Every wait in it is bounded, so a test that goes wrong still ends.
"""
from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from engine.endpoint import EndpointError, stream

MAX_WAIT_S = 10.0  # the longest any behaviour holds a connection open


def chunk(text: str | None = None, finish: str | None = None, **extra) -> dict:
    delta = {} if text is None else {"content": text}
    return {"id": "c1", "object": "chat.completion.chunk", "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def write_event(h: BaseHTTPRequestHandler, data) -> None:
    payload = data if isinstance(data, str) else json.dumps(data)
    h.wfile.write(f"data: {payload}\n\n".encode())
    h.wfile.flush()


def start_sse(h: BaseHTTPRequestHandler, content_type: str = "text/event-stream") -> None:
    h.send_response(200)
    h.send_header("Content-Type", content_type)
    h.send_header("Connection", "close")
    h.end_headers()


def sse(events, gap_s: float = 0.0):
    """A behaviour that streams `events` (dicts or raw strings), then [DONE]."""
    def run(h, body):
        start_sse(h)
        for e in events:
            write_event(h, e)
            time.sleep(gap_s)
        write_event(h, "[DONE]")
    return run


def status(code: int, body: str, content_type: str = "application/json"):
    def run(h, _body):
        data = body.encode()
        h.send_response(code)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    return run


class FakeServer:
    def __init__(self, behaviour, extra_get: dict | None = None):
        self.behaviour = behaviour
        self.extra_get = extra_get or {}  # path -> JSON for GET requests (probes, /v1/models)
        self.requests: list[dict] = []
        self.gets: list[dict] = []  # every GET (path, headers): probes and model listings
        self.client_left = threading.Event()  # a write failed: the client closed the connection
        self.release = threading.Event()  # set by close(): behaviours that hold a connection let go
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                fake.gets.append(dict(path=self.path, headers=dict(self.headers)))
                answer = fake.extra_get.get(self.path)
                if callable(answer):  # a behaviour of its own (a stall, a flood, a redirect)
                    try:
                        answer(self, None)
                    except (BrokenPipeError, ConnectionResetError):
                        fake.client_left.set()
                elif self.path in fake.extra_get:
                    status(200, json.dumps(answer))(self, None)
                else:
                    status(404, json.dumps({"error": {"message": f"no route {self.path}"}}))(self, None)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                fake.requests.append(dict(path=self.path, headers=dict(self.headers), body=body))
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    return status(404, json.dumps({"error": {"message": f"no route {self.path}"}}))(self, body)
                try:
                    fake.behaviour(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    fake.client_left.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def stall_after(events, fake_ref: list):
    """Stream `events`, then hold the connection silent until the client leaves (or MAX_WAIT_S)."""
    def run(h, body):
        start_sse(h)
        for e in events:
            write_event(h, e)
        fake = fake_ref[0]
        t = time.monotonic()
        while time.monotonic() - t < MAX_WAIT_S and not fake.release.is_set():
            if client_gone(h):
                fake.client_left.set()
                return
    return run


def client_gone(h, wait_s: float = 0.02) -> bool:
    """True once the client closed its end: its socket reads as end-of-file."""
    readable, _, _ = select.select([h.connection], [], [], wait_s)
    if not readable:
        return False
    try:
        return h.connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def slow_stream(fake_ref: list, gap_s: float = 0.05):
    """One token every gap_s until the client leaves (or MAX_WAIT_S): for Stop."""
    def run(h, body):
        start_sse(h)
        t = time.monotonic()
        i = 0
        while time.monotonic() - t < MAX_WAIT_S and not fake_ref[0].release.is_set():
            write_event(h, chunk(f" t{i}"))
            i += 1
            if client_gone(h, gap_s):
                fake_ref[0].client_left.set()
                return
    return run


def free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay(reads, speed: float = 1.0, within_s: float | None = None):
    """A behaviour that sends a transcript's reads at their recorded times divided by speed (or sped up so the
    whole transcript takes within_s: the gaps keep their proportions)."""
    if within_s and reads:
        speed = max(speed, reads[-1][0] / 1e3 / within_s)

    def run(h, body):
        start_sse(h)
        t0 = time.perf_counter()
        for t_ms, data in reads:
            wait = t_ms / 1e3 / speed - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(min(wait, MAX_WAIT_S))
            h.wfile.write(data)
            h.wfile.flush()
    return run


def key_of(h: BaseHTTPRequestHandler) -> str:
    """The key the client sent (what a server that echoes its headers would echo)."""
    return (h.headers.get("Authorization") or "").removeprefix("Bearer ")


def padded(text: str, at: int) -> str:
    """text placed so that it starts `at` characters in: a cut there falls inside it."""
    return "x" * at + text + " and more"


def echoing(where: str):
    """A server that puts the key it was sent into `where`: a field of its stream, its error reply or its
    headers. Every behaviour the key-leak tests run is here, so a new field is one entry."""
    def run(h, body):
        k = key_of(h)
        stream = {
            "error": [chunk("a"), {"error": {"message": f"bad key {k}"}}],
            "error object": [chunk("a"), {"error": {"code": k}}],
            "not json": [chunk("a"), f"{{oops {k}"],
            "not an object": [chunk("a"), json.dumps([k])],
            "content": [chunk(f"your key is {k}"), chunk(None, finish=f"stop {k}"),
                        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}],
            "cut prefix": [chunk("a"), {"error": {"message": padded(k, 300 - 40 - len(k) // 2)}}],
        }.get(where)
        if stream is not None:
            return sse(stream)(h, body)
        if where == "401 cut":  # the key straddles the 400 characters of the message
            return status(401, padded(k, 400 - len(k) // 2))(h, body)
        if where == "500 cut":  # the key straddles the 2000 bytes read of an error body
            return status(500, padded(k, 2000 - len(k) // 2))(h, body)
        if where == "reason":
            h.send_response(500, f"Bad {k}")
            h.send_header("Content-Length", "0")
            return h.end_headers()
        if where == "content type":
            return status(200, f"<html>{k}</html>", content_type=f"text/html; key={k}")(h, body)
        raise ValueError(f"no echoing behaviour {where!r}")
    return run


ECHOES = ("error", "error object", "not json", "not an object", "content", "cut prefix", "401 cut", "500 cut",
          "reason", "content type")


def echoing_gets(root_path: str = "/v1") -> dict:
    """GET answers that echo the key: llama-server's /props version and the model list's first id."""
    def props(h, _):
        status(200, json.dumps({"build_info": f"b1 {key_of(h)}"}))(h, None)

    def models(h, _):
        status(200, json.dumps({"data": [{"id": f"model-{key_of(h)}"}]}))(h, None)
    return {"/props": props, f"{root_path}/models": models}


def collect(ep, **kw):
    """Stream one run against `ep`: (rounds, the stream, the EndpointError or None); any other exception fails
    the test."""
    s = stream(ep, "hi", **kw)
    rounds = []
    try:
        for r in s:
            rounds.append(r)
    except EndpointError as e:
        return rounds, s, e
    return rounds, s, None
