"""One streamed JSON chunk -> a Chunk record: its text, what it says about its tokens, and the server's own
figures, read through the server's row of servers.SERVERS with the limits of engine.endpoint.peer."""
from __future__ import annotations

from dataclasses import dataclass

from engine.endpoint import peer
from engine.endpoint.errors import EndpointError, clip, redact
from engine.endpoint.servers import ServerFields, lookup
from engine.endpoint.sse import Event

ERROR_CHARS = 300  # of a server's mid-stream error message, kept in ours


@dataclass
class Chunk:
    index: int
    t_ms: float  # arrival, ms since the request was sent
    text: str = ""
    token_ids: list[int] | None = None  # the server's ids of this chunk's tokens
    token_texts: list[str] | None = None  # one string per token (logprobs entries)
    tokens_total: int | None = None  # the server's running count of generated tokens
    step_clock: float | None = None  # equal across one decode step's chunks (llama-server)
    step_ms_total: float | None = None
    prompt_ms: float | None = None
    drafted_total: int | None = None
    accepted_total: int | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    body: dict | None = None  # the parsed JSON, for the figures read once at the end
    nbytes: int = 0  # the event's bytes: no chunk carries more tokens than it has bytes

    @property
    def says_tokens(self) -> bool:
        return bool(self.text) or bool(self.token_ids) or bool(self.token_texts)


def _error_message(body: dict) -> str | None:
    err = body.get("error")
    if isinstance(err, dict):
        msg = err.get("message") or err
        return msg if isinstance(msg, str) else peer.text(msg, None, ERROR_CHARS)
    return (err if isinstance(err, str) else peer.text(err, None, ERROR_CHARS)) if err else None


def parse(event: Event, t0: float, fields: ServerFields, secret: str | None = None) -> Chunk:
    """The event's JSON as a Chunk; EndpointError naming the chunk when it is not a completion chunk. secret: the
    key, removed from every string built from the chunk (a server may echo the Authorization header)."""
    what = f"chunk {event.index}"
    body = peer.loads(event.data, what)
    if not isinstance(body, dict):
        raise EndpointError(f"{what} is JSON but not an object: {clip(repr(event.data[:120]), 160, secret)}")
    if (msg := _error_message(body)) is not None:
        raise EndpointError(f"the server reported an error mid-stream ({what}): {clip(msg, ERROR_CHARS, secret)}")
    choice = lookup(body, "choices.0")
    choice = choice if isinstance(choice, dict) else {}
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    logprobs = lookup(choice, "logprobs.content")
    finish = choice.get("finish_reason")
    return Chunk(
        index=event.index, t_ms=(event.t - t0) * 1e3, text=redact(text, secret) if isinstance(text, str) else "",
        token_ids=_ids(lookup(body, fields.token_ids), what),
        token_texts=[redact(str(e.get("token", "")), secret) for e in logprobs if isinstance(e, dict)]
        if isinstance(logprobs, list) and logprobs else None,
        tokens_total=peer.count(lookup(body, fields.tokens_total), fields.tokens_total, what),
        step_clock=peer.number(lookup(body, fields.step_clock)),
        step_ms_total=peer.number(lookup(body, fields.step_ms_total)),
        prompt_ms=peer.number(lookup(body, fields.prompt_ms)),
        drafted_total=peer.count(lookup(body, fields.drafted_total), fields.drafted_total, what),
        accepted_total=peer.count(lookup(body, fields.accepted_total), fields.accepted_total, what),
        finish_reason=peer.text(finish, secret, 40) if finish is not None else None,
        usage=body.get("usage") if isinstance(body.get("usage"), dict) else None,
        body=body, nbytes=len(event.data),
    )


def _ids(x, what: str) -> list[int] | None:
    if isinstance(x, list) and x and all(type(i) is int for i in x):
        return x
    return None
