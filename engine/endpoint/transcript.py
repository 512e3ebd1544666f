"""Recorded SSE transcripts: the bytes of every read of a real run, with the time each arrived, so the parser's
tests replay what a server really sent. JSON lines: a header object (the server, its version, the request, how
the file was made), then one {"t_ms", "bytes"} per read."""
from __future__ import annotations

import json
from pathlib import Path

FORMAT = "decodescope SSE transcript v1"


class Recorder:
    """A `tap` for EndpointStream that keeps every read."""

    def __init__(self):
        self.reads: list[tuple[float, bytes]] = []

    def __call__(self, t_ms: float, data: bytes) -> None:
        self.reads.append((t_ms, data))


def save(path: str | Path, header: dict, reads: list[tuple[float, bytes]]) -> Path:
    path = Path(path)
    lines = [json.dumps({"format": FORMAT, **header})]
    lines += [json.dumps({"t_ms": round(t, 3), "bytes": data.decode("utf-8")}) for t, data in reads]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def load(path: str | Path) -> tuple[dict, list[tuple[float, bytes]]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file (its first line says {header.get('format')!r})")
    return header, [(r["t_ms"], r["bytes"].encode("utf-8")) for r in map(json.loads, lines[1:])]
