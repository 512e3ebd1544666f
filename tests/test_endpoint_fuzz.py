"""A bounded fuzz of the endpoint client: the recorded llama-server and vLLM streams (tests/data) mutated
(truncated, a value's type swapped, huge / negative / NaN / infinite numbers, deep nesting, bad bytes, events
repeated) and replayed through the real client. The invariant for every mutant: the run ends normally or with
EndpointError (never another exception), the tokens that came before are kept and recordable (stats, CSV rows,
trace, page HTML), and no run holds more than max_new_tokens. A fixed seed and count, so a failure replays."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.endpoint import Endpoint, EndpointError, endpoint_stats, stream
from engine.endpoint.transcript import load
from tests.endpoint_fake import FakeServer, start_sse

DATA = Path(__file__).parent / "data"
SEED, MUTANTS = 20251202, 60  # per transcript: a few seconds in all
MAX_NEW = 24
RAW = "__raw__"  # a placeholder json.dumps writes, replaced by text JSON itself cannot produce
NASTY = [None, "", "x" * 300, True, -5, -1, 0, 10**17, 2**63, 1.5, -0.0, [], {}, [1, "a"], {"a": {"b": []}},
         RAW + "NaN", RAW + "Infinity", RAW + "-Infinity", RAW + "1e400", RAW + "9" * 5000, RAW + "[" * 5000,
         RAW + "-" + "9" * 30]


def events_of(reads: list[tuple[float, bytes]]) -> list[bytes]:
    return [e for e in b"".join(data for _, data in reads).split(b"\n\n") if e.strip()]


def paths(obj, prefix=()):
    """Every place in a JSON value: a key of a dict or an index of a list."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from paths(v, prefix + (k,))


def mutate_json(data: str, rng: random.Random) -> str:
    body = json.loads(data)
    places = list(paths(body))
    if not places:
        return data
    for _ in range(rng.randint(1, 3)):
        *head, last = rng.choice(places)
        cur = body
        try:
            for k in head:
                cur = cur[k]
            cur[last] = rng.choice(NASTY)
        except (KeyError, IndexError, TypeError):  # an earlier swap changed the shape
            continue
    text = json.dumps(body)
    for v in NASTY:
        if isinstance(v, str) and v.startswith(RAW):
            text = text.replace(json.dumps(v), v[len(RAW):])
    return text


def mutant(events: list[bytes], rng: random.Random) -> bytes:
    events = list(events)
    kind = rng.choice(("json", "json", "json", "truncate", "bytes", "repeat", "swap"))
    i = rng.randrange(len(events))
    if kind == "json" and events[i].startswith(b"data: {"):
        events[i] = b"data: " + mutate_json(events[i][6:].decode(), rng).encode()
    elif kind == "truncate":
        stream = b"\n\n".join(events) + b"\n\n"
        return stream[:rng.randrange(len(stream))]
    elif kind == "bytes":
        e = events[i]
        at = rng.randrange(len(e) + 1)
        events[i] = e[:at] + rng.choice((b"\xff\xfe", b"\x00", b"\xc3", b"\r", b"\n\ndata: ")) + e[at:]
    elif kind == "repeat":
        events[i:i + 1] = [events[i]] * rng.randint(2, 40)
    else:
        j = rng.randrange(len(events))
        events[i], events[j] = events[j], events[i]
    return b"\n\n".join(events) + b"\n\n"


@pytest.mark.parametrize("name", ["llama-server-plain.jsonl", "llama-server-ngram.jsonl", "vllm-spec-detailed.jsonl"])
def test_every_mutant_ends_as_done_or_failed_with_its_tokens_kept(name):
    from ui import export, render

    header, reads = load(DATA / name)
    events, rng, current = events_of(reads), random.Random(f"{SEED}-{name}"), [b""]

    def replay(h, body):
        start_sse(h)
        h.wfile.write(current[0])
        h.wfile.flush()

    outcomes = {"done": 0, "failed": 0}
    with FakeServer(replay) as fake:
        for n in range(MUTANTS):
            current[0] = mutant(events, rng)
            s = stream(Endpoint(fake.url, model="m", server=header["server"], stall_s=5), "x",
                       max_new_tokens=MAX_NEW)
            rounds = []
            try:
                for r in s:
                    rounds.append(r)
                outcomes["done"] += 1
            except EndpointError as e:
                assert str(e) and s.info.failed == str(e), (n, e)
                outcomes["failed"] += 1
            assert sum(len(r.emitted) for r in rounds) <= MAX_NEW, n
            stats = endpoint_stats(rounds, s.info, {"max_new_tokens": MAX_NEW})
            stats.summary()
            export.token_rows("r", stats, str), export.chrome_trace("r", stats)
            json.dumps(export.chrome_trace("r", stats), allow_nan=False, default=str)
            render.render_rounds(rounds, str)
    assert outcomes["failed"] and outcomes["done"], outcomes  # the mutations reach both ends
