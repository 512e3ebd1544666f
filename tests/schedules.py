"""Schedules for the speculative tests: the real Schedule fed modeled round times (its choices then follow the
acceptance it sees, not the shared machine's load), and one that draws k at random."""
from dataclasses import replace

import torch

from engine.speculative import Schedule


class Modeled(Schedule):
    """The real Schedule, observing each round with the time a modeled machine would have taken: a plain step
    1 ms, a verify pass of T positions `1 + slope (T - 1)` ms, a draft token `draft` ms (0 for a lookup)."""
    slope, draft = 0.02, 0.05  # cheap enough that a drafter kept half the time drafts 3 or 4 within a few rounds

    def observe(self, rnd):
        k = rnd.n_drafted
        propose = k * (0.0 if self.drafter.draft_cost == 0 else self.draft)
        ms = propose + 1 + self.slope * k
        super().observe(replace(rnd, t_end_ms=rnd.t_start_ms + ms, draft_ms=propose, propose_ms=propose))

    def recall(self, engine):
        pass  # no slope carried from the engine's last run: a test's runs start alike and differ in their seeds


class RandomK(Schedule):
    """A schedule whose k is drawn from its own generator before each round, 0 (a plain step) included."""

    def __init__(self, k_max, drafter, adaptive=True):
        super().__init__(k_max, drafter, adaptive)
        self.rng = torch.Generator().manual_seed(7)

    def choose(self, ctx, tokens_left):
        hi = min(self.k_max, tokens_left - 1)
        return 0 if ctx is None or hi < 1 else int(torch.randint(0, hi + 1, (1,), generator=self.rng))

    def observe(self, rnd):
        pass
