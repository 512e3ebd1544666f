"""Prometheus counters around a run (vLLM's spec-decode counters): read /metrics before and after, keep the
deltas. Server-wide counters, so the figure is the run's only while nothing else runs on that server."""
from __future__ import annotations

import math
import re

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)')
_POS = re.compile(r'position="(\d{1,3})"')
MAX_POSITIONS = 64  # draft positions kept per counter: no drafter proposes more


def parse(text: str, names: dict[str, str]) -> dict:
    """{figure: value} for the counters in `names` (figure -> metric name), summed over label sets; a per-position
    counter gives a list by position."""
    want = {v: k for k, v in names.items()}
    out: dict = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in want:
            continue
        try:
            fig, value = want[m.group(1)], float(m.group(3))
        except ValueError:  # the pattern lets "e" or "-" through: not a number, not a counter
            continue
        if not math.isfinite(value) or not 0 <= value < 2 ** 53:
            continue
        if (pos := _POS.search(m.group(2) or "")) is not None:
            per = out.setdefault(fig, [])
            if not isinstance(per, list) or (p := int(pos.group(1))) >= MAX_POSITIONS:
                continue
            per.extend([0.0] * (p + 1 - len(per)))
            per[p] += value
        elif not isinstance(out.get(fig), list):
            out[fig] = out.get(fig, 0.0) + value
    return out


def delta(before: dict, after: dict) -> dict:
    out = {}
    for k, v in after.items():
        b = before.get(k)
        if isinstance(v, list) != isinstance(b, list) and b is not None:
            continue
        if isinstance(v, list):
            b = b or []
            out[k] = [int(round(x - (b[i] if i < len(b) else 0.0))) for i, x in enumerate(v)]
        else:
            out[k] = int(round(v - (b or 0.0)))
    return out
