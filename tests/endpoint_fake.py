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
        self.client_left = threading.Event()  # a write failed: the client closed the connection
        self.release = threading.Event()  # set by close(): behaviours that hold a connection let go
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                if self.path in fake.extra_get:
                    status(200, json.dumps(fake.extra_get[self.path]))(self, None)
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
