"""Before a run: the key's header, the bounded GET every probe goes through, which server answers at an endpoint
(probed once per server root) and which model it serves when none was named.

Every GET reads at most PROBE_BYTES, ends by the run's deadline, and is ended within POLL_S by a Stop: the read
runs on a thread of its own and a socket shutdown wakes it, as for the stream (client.py)."""
from __future__ import annotations

import http.client
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable

from engine.endpoint import peer, servers
from engine.endpoint.config import Endpoint
from engine.endpoint.errors import EndpointError, clip

POLL_S = 0.05
PROBE_BYTES = 1 << 20  # /props, /version, /v1/models, /metrics: a few KiB from every server we know
_probed: dict[str, tuple[str, str | None]] = {}  # server root -> (server name, version)
_models: dict[str, str] = {}  # base URL -> the first model it lists


class Stopped(Exception):  # noqa: N818  (not an error: the user pressed Stop)
    """cancelled() turned true while a request was in flight."""


def headers(ep: Endpoint) -> dict:
    h = {"Accept": "text/event-stream"}
    if ep.api_key:
        h["Authorization"] = f"Bearer {ep.api_key}"
    return h


def connect(ep: Endpoint, u: urllib.parse.SplitResult) -> http.client.HTTPConnection:
    """A connection with no proxy from the environment (none sees the prompt or the key) that follows no
    redirect (a listed endpoint must not send the app to another address); a read waiting stall_s is a stall."""
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = cls(u.hostname, u.port, timeout=ep.connect_s)
    conn.connect()
    conn.sock.settimeout(ep.stall_s)
    return conn


class Prober:
    """The GETs before and after a run, each bounded in bytes and time and ended by a Stop."""

    def __init__(self, ep: Endpoint, cancelled: Callable[[], bool], deadline: float):
        self.ep, self.cancelled, self.deadline = ep, cancelled, deadline

    def get(self, url: str) -> tuple[int, bytes] | None:
        """(status, at most PROBE_BYTES of the body), or None when the request failed; Stopped on a Stop."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        box: dict = {}

        def read():
            conn = None
            try:
                u = urllib.parse.urlsplit(url)
                conn = box["conn"] = connect(self.ep, u)
                conn.request("GET", u.path, headers=headers(self.ep))
                resp = conn.getresponse()
                got = bytearray()
                while len(got) < PROBE_BYTES and (data := resp.read1(PROBE_BYTES - len(got))):
                    got += data
                q.put((resp.status, bytes(got)))
            except (OSError, http.client.HTTPException, ValueError):
                q.put(None)
            finally:
                if conn is not None:
                    conn.close()

        threading.Thread(target=read, name="endpoint-probe", daemon=True).start()
        while True:
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                stop = self.cancelled()
                if stop or time.perf_counter() > self.deadline:
                    if (conn := box.get("conn")) is not None and conn.sock is not None:
                        try:
                            conn.sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    if stop:
                        raise Stopped() from None
                    return None

    def get_json(self, url: str, what: str):
        """The JSON a GET answered with (200 only), or None; an answer over the limits is no answer."""
        return _json(self.get(url), what)

    def detect(self) -> tuple[str, str | None]:
        """(server name, version): the configured one, or the first whose probe answers (once per server root)."""
        ep = self.ep
        if ep.server != servers.AUTO:
            fields = servers.server(ep.server)
            body = self.get_json(ep.root + fields.probe[0], fields.probe[0]) if fields.probe else None
            return ep.server, self._version(body, fields)
        if ep.root not in _probed:
            found = (servers.GENERIC, None)
            for fields in servers.SERVERS.values():
                if fields.probe and isinstance(body := self.get_json(ep.root + fields.probe[0], fields.probe[0]),
                                               dict) and fields.probe[1] in body:
                    found = (fields.name, self._version(body, fields))
                    break
            _probed[ep.root] = found
        return _probed[ep.root]

    def _version(self, body, fields: servers.ServerFields) -> str | None:
        v = servers.lookup(body, fields.version) if body is not None else None
        return peer.text(v, self.ep.api_key, 80) or None

    def resolve_model(self) -> str:
        ep = self.ep
        if ep.model:
            return ep.model
        if ep.url not in _models:
            got = self.get(ep.url + "/models")
            if got is None:
                raise EndpointError(f"cannot reach {ep.url}/models (no model was named, so the client asked the "
                                    "server which it serves); is the server running there?")
            if 300 <= got[0] < 400:
                raise EndpointError(f"{ep.url}/models redirected ({got[0]}); give the final URL (redirects are not "
                                    "followed)", status=got[0])
            body = _json(got, "/models")
            name = servers.lookup(body, "data.0.id") if isinstance(body, dict) else None
            if not isinstance(name, str) or not name:
                raise EndpointError(f"no model was named and {ep.url}/models lists none (it answered {got[0]}); "
                                    "give the model's name")
            _models[ep.url] = clip(name, peer.TEXT_CHARS, ep.api_key)
        return _models[ep.url]


def _json(got: tuple[int, bytes] | None, what: str):
    if got is None or got[0] != 200:
        return None
    try:
        return peer.loads(got[1].decode("utf-8"), what)
    except (EndpointError, UnicodeDecodeError):
        return None
