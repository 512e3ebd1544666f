"""One streamed JSON chunk -> a Chunk record: its text, what it says about its tokens, and the server's own
figures, read through the server's row of servers.SERVERS."""
from __future__ import annotations

import json
from dataclasses import dataclass

from engine.endpoint.errors import EndpointError
from engine.endpoint.servers import ServerFields, lookup
from engine.endpoint.sse import Event


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

    @property
    def says_tokens(self) -> bool:
        return bool(self.text) or bool(self.token_ids) or bool(self.token_texts)


def _int(x) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _float(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _error_message(body: dict) -> str | None:
    err = body.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err) if err else None


def parse(event: Event, t0: float, fields: ServerFields) -> Chunk:
    """The event's JSON as a Chunk; EndpointError naming the chunk when it is not a completion chunk."""
    try:
        body = json.loads(event.data)
    except json.JSONDecodeError as e:
        raise EndpointError(f"chunk {event.index} is not JSON ({e.msg} at character {e.pos}): "
                            f"{event.data[:120]!r}") from None
    if not isinstance(body, dict):
        raise EndpointError(f"chunk {event.index} is JSON but not an object: {event.data[:120]!r}")
    if (msg := _error_message(body)) is not None:
        raise EndpointError(f"the server reported an error mid-stream (chunk {event.index}): {msg[:300]}")
    choice = lookup(body, "choices.0") or {}
    delta = choice.get("delta") if isinstance(choice, dict) else None
    text = (delta or {}).get("content") if isinstance(delta, dict) else choice.get("text")
    logprobs = lookup(choice, "logprobs.content")
    c = Chunk(
        index=event.index, t_ms=(event.t - t0) * 1e3, text=text if isinstance(text, str) else "",
        token_ids=_ids(lookup(body, fields.token_ids)),
        token_texts=[str(e.get("token", "")) for e in logprobs if isinstance(e, dict)]
        if isinstance(logprobs, list) and logprobs else None,
        tokens_total=_int(lookup(body, fields.tokens_total)),
        step_clock=_float(lookup(body, fields.step_clock)),
        step_ms_total=_float(lookup(body, fields.step_ms_total)),
        prompt_ms=_float(lookup(body, fields.prompt_ms)),
        drafted_total=_int(lookup(body, fields.drafted_total)),
        accepted_total=_int(lookup(body, fields.accepted_total)),
        finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
        usage=body.get("usage") if isinstance(body.get("usage"), dict) else None,
        body=body,
    )
    return c


def _ids(x) -> list[int] | None:
    if isinstance(x, list) and x and all(isinstance(i, int) for i in x):
        return x
    return None
