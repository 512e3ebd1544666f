"""The streaming client: one request, its SSE chunks timed as their bytes arrive, Round events out.

A reader thread does the blocking reads and stamps each read with perf_counter (the clock our engine's rounds
use); the generator assembles rounds from what it hands over. So the time a chunk arrived does not depend on how
fast the caller consumes rounds, a Stop or a stall is noticed within POLL_S however long the server is silent,
and closing the connection (a socket shutdown wakes the blocked read) ends the server's work on the request.

Every run is bounded whatever the server does: its probes and its stream read at most so many bytes, the whole
run ends by a deadline (a server that dribbles a byte or a keep-alive comment now and then cannot hold it), and
the client stops reading once max_new_tokens have arrived.
"""
from __future__ import annotations

import json
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

from engine.endpoint import metrics, peer, servers
from engine.endpoint.chunks import parse
from engine.endpoint.config import Endpoint, EndpointInfo
from engine.endpoint.errors import EndpointError, clip
from engine.endpoint.probe import POLL_S, Prober, Stopped, connect, headers
from engine.endpoint.rounds import TOKENS_FROM, RoundBuilder, apply_per_step
from engine.endpoint.sse import SSEParser
from engine.stats import Round

ERROR_BODY_BYTES = 2000
STREAM_BYTES_PER_TOKEN = 16 << 10  # a chunk per token is a few hundred bytes (with logprobs a few KiB)
STREAM_BYTES_BASE = 1 << 20  # role and usage chunks, and room for one chunk at the event limit
MAX_TOKEN_S = 1.0  # the deadline allows this per token beyond two stall limits: slower than any server we profile
HINTS = {
    401: "check the API key (the key field, or the variable --api-key-env names)",
    403: "the key is not allowed to use this endpoint or model",
    404: "check the base URL (usually ending in /v1), the model name and the API (chat or completion)",
    429: "the server is rate limiting or its queue is full; wait and run again",
}


def _http_error(status: int, reason: str, body: bytes, key: str | None) -> EndpointError:
    if 300 <= status < 400:
        msg = f"the endpoint redirected ({status}); give the final URL (redirects are not followed)"
    else:
        text = clip(body[:ERROR_BODY_BYTES].decode("utf-8", "replace").strip(), 400, key)
        msg = f"the endpoint answered {status} {clip(reason, 80, key)}".rstrip()
        msg += f": {text}" if text else " with an empty body"
        if hint := HINTS.get(status) or ("the server failed; its log says why" if status >= 500 else None):
            msg += f" ({hint})"
    return EndpointError(msg, status=status)


def deadline_s(ep: Endpoint, max_new_tokens: int) -> float:
    """The longest a run may take: the probes' and the prompt's stall limits, then MAX_TOKEN_S per token."""
    return 2 * ep.stall_s + max_new_tokens * MAX_TOKEN_S


class EndpointStream:
    """Iterate for the run's Rounds; `info` holds what else the run learned (filled as it goes)."""

    def __init__(self, ep: Endpoint, prompt: str, *, chat: bool = True, max_new_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = 0,
                 tokenizer=None, cancelled: Callable[[], bool] = lambda: False,
                 tap: Callable[[float, bytes], None] | None = None, extra: dict | None = None):
        if not prompt:
            raise ValueError("the prompt is empty")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
        self.ep, self.prompt, self.chat, self.tokenizer, self.cancelled = ep, prompt, chat, tokenizer, cancelled
        self.max_new_tokens = max_new_tokens
        self.max_bytes = STREAM_BYTES_BASE + max_new_tokens * STREAM_BYTES_PER_TOKEN
        self.tap = tap  # (ms since the request, bytes) of every read: how transcripts are recorded
        self.extra = dict(extra or {})  # more request fields (a server's own, e.g. llama-server's ignore_eos)
        self.sampling = dict(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        if top_k:
            self.sampling["top_k"] = top_k  # not OpenAI's; llama-server, vLLM and SGLang take it
        self.info = EndpointInfo(endpoint=ep.url, api="chat" if chat else "completion")
        self.stopped = False  # ended by cancelled(), not by the server
        self._sock: socket.socket | None = None  # the streaming request's socket, for _abort
        self._closing = threading.Event()
        self.deadline = 0.0  # perf_counter() by which the run ends, set when it starts

    def request_body(self, fields: servers.ServerFields, model: str) -> dict:
        body = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **self.sampling}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        for k, v in {**fields.request, **self.extra}.items():
            body[k] = {**body[k], **v} if isinstance(v, dict) and isinstance(body.get(k), dict) else v
        return body

    def __iter__(self) -> Iterator[Round]:
        ep, info = self.ep, self.info
        self.deadline = time.perf_counter() + deadline_s(ep, self.max_new_tokens)
        probe = Prober(ep, self.cancelled, self.deadline)
        try:
            info.server, info.server_version = probe.detect()
            info.endpoint_model = probe.resolve_model()
            fields = servers.server(info.server)
            prom_before = self._prometheus(probe, fields)
        except Stopped:
            self.stopped = True
            return
        except EndpointError as e:
            info.failed = str(e)
            raise
        url = ep.url + ("/chat/completions" if self.chat else "/completions")
        yield from self._stream(url, self.request_body(fields, info.endpoint_model), fields)
        if prom_before is not None and not self.stopped and info.failed is None:
            try:
                self._prometheus_delta(probe, fields, prom_before)
            except Stopped:
                pass

    def _prometheus(self, probe: Prober, fields) -> dict | None:
        if not fields.prometheus:
            return None
        got = probe.get(self.ep.root + "/metrics")
        if got is None or got[0] != 200:
            return None
        return metrics.parse(got[1].decode("utf-8", "replace"), fields.prometheus)

    def _prometheus_delta(self, probe: Prober, fields, before: dict) -> None:
        after = self._prometheus(probe, fields)
        if after is None:
            return
        d = {k: v for k, v in metrics.delta(before, after).items()
             if (min(v) if isinstance(v, list) and v else v if not isinstance(v, list) else 0) >= 0}
        info = self.info
        info.server_drafted = info.server_drafted if info.server_drafted is not None else d.get("drafted")
        info.server_accepted = info.server_accepted if info.server_accepted is not None else d.get("accepted")
        info.server_spec_steps = info.server_spec_steps if info.server_spec_steps is not None else d.get("drafts")
        info.server_accepted_per_pos = d.get("accepted_per_pos")

    def _read(self, url: str, body: dict, q: queue.SimpleQueue) -> None:
        """The reader thread: ('head', status, reason, content type) or ('body', bytes) for an error reply, then
        ('data', t, bytes) per read; ('error', exception) if it failed; always ('end',) last. It reads no more
        than max_bytes: a longer stream is cut there (the generator names it)."""
        c0, conn, got = time.thread_time(), None, 0
        try:
            u = urllib.parse.urlsplit(url)
            conn = connect(self.ep, u)
            self._sock = conn.sock
            conn.request("POST", u.path + (f"?{u.query}" if u.query else ""), body=json.dumps(body).encode(),
                         headers={**headers(self.ep), "Content-Type": "application/json"})
            resp = conn.getresponse()
            ctype = resp.getheader("content-type", "")
            q.put(("head", resp.status, resp.reason, ctype))
            if resp.status != 200 or "text/event-stream" not in ctype:
                err = b""
                while (data := resp.read1(ERROR_BODY_BYTES)) and not self._closing.is_set():
                    err += data
                    if len(err) >= ERROR_BODY_BYTES:
                        break
                q.put(("body", err))
                return
            while data := resp.read1(1 << 16):  # what the socket has (chunked decoding included), at most 64 KiB
                got += len(data)
                q.put(("data", time.perf_counter(), data))
                if self._closing.is_set():
                    break
                if got > self.max_bytes:
                    q.put(("too long", got))
                    break
        except Exception as e:  # noqa: BLE001  (handed to the generator, which names it)
            if not self._closing.is_set():
                q.put(("error", e))
        finally:
            if conn is not None:
                conn.close()
            self.info.read_cpu_ms = (time.thread_time() - c0) * 1e3  # before ('end',): the generator reads it after
            q.put(("end",))

    def _abort(self) -> None:
        """Close the connection now, from this thread: shutdown wakes the reader's blocked read."""
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _stream(self, url: str, body: dict, fields) -> Iterator[Round]:
        ep, info, key = self.ep, self.info, self.ep.api_key
        builder, sse = RoundBuilder(self.tokenizer, budget=self.max_new_tokens), SSEParser()
        q: queue.SimpleQueue = queue.SimpleQueue()
        t0 = time.perf_counter()
        reader = threading.Thread(target=self._read, args=(url, body, q), name="endpoint-read", daemon=True)
        reader.start()
        last_byte, head = time.perf_counter(), None
        try:
            while True:
                if self.cancelled():
                    self.stopped = True
                    yield from builder.close()
                    return
                try:
                    item = q.get(timeout=POLL_S)
                except queue.Empty:
                    now = time.perf_counter()
                    if now - last_byte > ep.stall_s:
                        yield from builder.close()
                        raise self._fail(builder, f"the server sent nothing for {ep.stall_s:g} s"
                                         + (" before answering" if head is None else "")) from None
                    if now > self.deadline:
                        yield from builder.close()
                        raise self._fail(builder, f"the run passed its deadline of "
                                         f"{deadline_s(ep, self.max_new_tokens):g} s (two stall limits and "
                                         f"{MAX_TOKEN_S:g} s per token asked for)") from None
                    continue
                kind = item[0]
                if kind == "head":
                    head, last_byte = item, time.perf_counter()
                elif kind == "body":
                    status, reason, ctype = head[1:]
                    if status == 200:
                        text = clip(repr(item[1][:200].decode("utf-8", "replace")), 240, key)
                        raise EndpointError(f"the endpoint answered with {clip(ctype, 80, key) or 'no content type'}"
                                            f", not an event stream (is it an OpenAI-compatible API?): {text}")
                    raise _http_error(status, reason, item[1], key)
                elif kind == "data":
                    last_byte = item[1]
                    if self.tap is not None:
                        self.tap((item[1] - t0) * 1e3, item[2])
                    a, a_cpu, done, bad = time.perf_counter(), time.thread_time(), [], None
                    try:
                        for event in sse.events(item[2], item[1]):
                            done += builder.add(parse(event, t0, fields, key))
                            info.chunks += 1
                            if builder.over:
                                break
                    except EndpointError as e:  # the rounds its read completed before the bad chunk still count
                        bad = e
                    # CPU clock read inside the wall span at both ends (its clock is a syscall): CPU <= wall
                    info.client_cpu_ms += (time.thread_time() - a_cpu) * 1e3
                    info.client_ms += (time.perf_counter() - a) * 1e3
                    yield from done
                    if bad is not None:
                        raise bad
                    if builder.over:  # a server that ignores max_tokens: the run ends at the budget
                        yield from builder.close()
                        builder.finish_reason = builder.finish_reason or "length"
                        info.note = (f"the server sent more than the {self.max_new_tokens} tokens asked for; the "
                                     "client stopped reading there")
                        self._finish(builder, fields)
                        return
                elif kind == "too long":
                    yield from builder.close()
                    raise self._fail(builder, f"the stream passed {self.max_bytes} bytes ({STREAM_BYTES_PER_TOKEN} "
                                     f"per token asked for); the server's stream is not one this client reads")
                elif kind == "error":
                    yield from builder.close()
                    raise self._fail(builder, self._describe(item[1]))
                else:  # end of the byte stream
                    for event in sse.close(time.perf_counter()):
                        yield from builder.add(parse(event, t0, fields, key))
                        info.chunks += 1
                    yield from builder.close()
                    if builder.finish_reason is None and not sse.done:
                        raise self._fail(builder, "the server closed the stream before the run finished")
                    self._finish(builder, fields)
                    return
        except EndpointError as e:
            if not e.partial:
                e.partial = bool(builder.rounds)
            info.failed = str(e)
            yield from builder.close()
            raise
        finally:
            self._abort()

    def _describe(self, e: Exception) -> str:
        key = self.ep.api_key
        if self._sock is None and isinstance(e, OSError):  # it failed before a connection was made
            return clip(f"cannot connect to {self.ep.url} ({e}); is the server running there?", 400, key)
        if isinstance(e, TimeoutError):
            return f"the server sent nothing for {self.ep.stall_s:g} s ({type(e).__name__})"
        return clip(f"the connection failed: {type(e).__name__}: {e}", 400, key)

    def _fail(self, builder: RoundBuilder, msg: str) -> EndpointError:
        n = sum(len(r.emitted) for r in builder.rounds)
        if n:
            msg += f"; the {n} tokens that arrived are kept, the run is marked failed"
        return EndpointError(msg, partial=bool(n))

    def _finish(self, builder: RoundBuilder, fields) -> None:
        """The figures the stream ends with, each checked as peer.count / peer.number check a chunk's."""
        info, last = self.info, builder.last
        info.stop_reason = builder.finish_reason
        usage, what = builder.usage or {}, "the last chunk"
        info.prompt_tokens = peer.count(usage.get("prompt_tokens"), "usage.prompt_tokens", what)
        info.completion_tokens = peer.count(usage.get("completion_tokens"), "usage.completion_tokens", what)
        if builder.sources:
            info.tokens_from = TOKENS_FROM[builder.sources.most_common(1)[0][0]]
        body = last.body if last is not None else None
        per_step = (peer.counts(servers.lookup(body, fields.per_step_accepted), "per_step_accepted", what),
                    peer.counts(servers.lookup(body, fields.per_step_drafted), "per_step_drafted", what))
        if any(r.n_drafted for r in builder.rounds):
            info.kinds_from = "the server, per step"
        elif all(x is not None for x in per_step) and apply_per_step(builder.rounds, *per_step):
            info.kinds_from = "the server's per-step arrays"
        elif any(t.inferred for r in builder.rounds for t in r.tokens):
            info.kinds_from = "inferred from tokens per chunk"
        for name in ("ms_per_token", "prompt_ms"):
            setattr(info, f"server_{name}", peer.number(servers.lookup(body, getattr(fields, name))))
        for name, path in (("drafted", fields.drafted_total), ("accepted", fields.accepted_total),
                           ("spec_steps", fields.spec_steps)):
            setattr(info, f"server_{name}", peer.count(servers.lookup(body, path), path, what))
        if builder.rounds:
            builder.rounds[-1].finished = True

def stream(ep: Endpoint, prompt: str, **kw) -> EndpointStream:
    return EndpointStream(ep, prompt, **kw)
