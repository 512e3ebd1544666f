"""What a server sends, read with its limits stated up front: JSON no deeper than MAX_DEPTH, integers of at most
MAX_DIGITS digits, finite numbers only, counts within [0, MAX_COUNT], strings cut to a length and redacted.
Anything outside them is an EndpointError naming the chunk and the value: the one exception for "the peer sent
something bad" (every other exception out of a run is a bug)."""
from __future__ import annotations

import json
import math
import re

from engine.endpoint.errors import EndpointError, clip

MAX_DEPTH = 32  # a completion chunk nests about 6 deep (choices.0.logprobs.content.0.top_logprobs)
MAX_DIGITS = 18  # every count or clock a server reports fits in 18 digits; Python's own limit is 4300
MAX_COUNT = 1 << 31  # a token count, draft count or list position past this is no count of one run
TEXT_CHARS = 200  # a server's string kept as a setting (version, model, finish reason)
_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]')


class _Bad(ValueError):
    pass


def _int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_DIGITS:
        raise _Bad(f"an integer of {len(s.lstrip('-'))} digits (at most {MAX_DIGITS} are read)")
    return int(s)


def _float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise _Bad(f"the number {s[:40]} (too large for a float)")
    return x


def _constant(s: str):
    raise _Bad(f"{s}, which JSON does not allow")


def _depth(data: str) -> int:
    depth = top = 0
    for m in _BRACKETS.finditer(data):
        c = m.group()
        if c in "[{":
            depth += 1
            top = max(top, depth)
            if top > MAX_DEPTH:
                break
        elif c in "]}":
            depth -= 1
    return top


def loads(data: str, what: str):
    """data's JSON within the limits above, or EndpointError saying what was wrong with `what` (e.g. "chunk 3")."""
    if data.count("[") + data.count("{") > MAX_DEPTH and _depth(data) > MAX_DEPTH:
        raise EndpointError(f"{what} nests deeper than {MAX_DEPTH} levels; no completion chunk does")
    try:
        return json.loads(data, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _Bad as e:
        raise EndpointError(f"{what} has {e}") from None
    except json.JSONDecodeError as e:
        raise EndpointError(f"{what} is not JSON ({e.msg} at character {e.pos})") from None
    except RecursionError:  # the depth check reads strings as the scanner does; kept so no other error escapes
        raise EndpointError(f"{what} nests too deeply to read") from None


def count(x, name: str, what: str) -> int | None:
    """A count the server reported: None where it sent none (or not a number), EndpointError where it is out
    of range (a negative or absurd count would size lists)."""
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not 0 <= x <= MAX_COUNT or x != int(x):
        raise EndpointError(f"{what}: {name} = {x!r} is not a count (a whole number from 0 to {MAX_COUNT})")
    return int(x)


def number(x) -> float | None:
    """A figure (ms) the server reported, or None; loads() already refused non-finite numbers."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def counts(x, name: str, what: str) -> list[int] | None:
    """A list of counts (vLLM's per-step arrays), or None where it is not a list."""
    if not isinstance(x, list):
        return None
    out = [count(v, name, what) for v in x]
    return out if all(v is not None for v in out) else None


def text(x, secret: str | None, n: int = TEXT_CHARS) -> str | None:
    """A server's string kept beyond the run (a setting, a CSV cell): at most n characters, the key removed."""
    if x is None:
        return None
    return clip(x if isinstance(x, str) else json.dumps(x)[:n], n, secret)
