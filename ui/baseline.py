"""The plain baseline a speculative run's "× N vs plain" is against: plain decoding of the same prompt with the same
settings (weights, window, sampling, length, chat), measured once per prompt and kept. A plain run of the prompt
is one (the newest counts); a speculative run that has none measures it right after itself, saying so. A baseline
older than STALE_S is still shown, marked stale: the machine's load moves within minutes, so the ratio then rests
on an older minute than the run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.request import SPECS, Request

STALE_S = 600.0
# the settings only a drafter reads: plain decoding is the same whatever they say
DRAFTER_ONLY = ("mode", "k", "adaptive", "ngram", "layers", "draft_model")


def plain_of(s: Request, launch_weights: str) -> Request:
    """The plain run a speculative one is compared with: its settings, the drafter's at their defaults, the weights
    named (so '' and the launch format are one baseline), the model left out (a runtime keeps its own model's)."""
    return s.with_(**{n: SPECS[n].default for n in DRAFTER_ONLY}, weights=s.weights or launch_weights, model="")


@dataclass(frozen=True)
class Baseline:
    tok_s: float
    at: float  # the clock's reading when it was measured

    def describe(self, now: float) -> str:
        age = max(0.0, now - self.at)
        when = f"{age:.0f} s ago" if age < 90 else f"{age / 60:.0f} min ago"
        note = f"plain decoding of this prompt with the same settings: {self.tok_s:.1f} tok/s, measured {when}"
        if self.stale(now):
            note += " (stale: the machine's load may have moved since; a plain run of the prompt measures it again)"
        return note

    def stale(self, now: float) -> bool:
        return now - self.at > STALE_S


class Baselines:
    """(prompt ids, plain settings) -> the newest Baseline, for one model's runtime."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.kept: dict[tuple, Baseline] = {}

    @staticmethod
    def key(ids: list[int], plain: Request) -> tuple:
        return tuple(ids), tuple(plain.flat().items())

    def get(self, ids: list[int], plain: Request) -> Baseline | None:
        return self.kept.get(self.key(ids, plain))

    def put(self, ids: list[int], plain: Request, tok_s: float) -> Baseline:
        self.kept[self.key(ids, plain)] = b = Baseline(tok_s, self.clock())
        return b
