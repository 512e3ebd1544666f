"""The adaptive draft length: each speculative round drafts the k (0 = a plain decode step) with the most
expected tokens per second, E(k) / C(k), judged from this run's measured verify costs, draft costs and
per-context acceptance (decayed Beta posteriors; estimates.py), probing with one draft where an optimistic bound
says drafting could pay. A drafter tells the schedule its context(), prior(context) and draft_cost (drafters.py).
The model, its priors and when it probes: docs/SPECULATIVE.md.
"""
from __future__ import annotations

import math
import time
import weakref
from collections.abc import Hashable

from engine.speculative.estimates import PRIOR_VERIFY_SLOPE, Acceptance, Costs, expected_tokens, median

MIN_GAIN = 1.05  # k > 0 must beat a plain step's expected tok/s by 5%: estimates are noisy and the best-looking
# k is biased upward by being picked, so a break-even draft would lose more often than it wins
SLOPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> [(time, verify slope per step)] of
# its last SLOPES_KEPT speculative runs that measured one (remember_slope, recalled_slope)
SLOPES_KEPT = 5  # a run starts from the median of these, so one run measured under a load spike does not rule
SLOPE_TTL_S = 300.0  # and only from those this recent: the machine's load moves the slope, and a slope that makes a
# drafter sit out (layer-skip) is never measured again by that drafter
REPROBE = 32  # rounds without a draft before a drafter too costly to pay is measured again (then 64, 128, ...; a
# drafter kept between runs carries the interval its last run reached while its cost measurement is trusted), and
# before a lookup ruled out only by the verify cost an earlier run measured (recall) measures this run's
HOLD = 16  # rounds a context's "plain" verdict stands while no round drafts: in that time only decay (15% over
# 16 rounds) and the plain step's median move the estimates, so the verdict is recomputed that often at most,
# and a plain round otherwise costs a dict probe; a context that turns good is probed at most HOLD rounds late


class Schedule:
    """Picks each round's k for speculative.stream. adaptive=False drafts the most the budget allows every
    round the drafter has something to propose (the fixed-k behaviour)."""

    def __init__(self, k_max: int, drafter, adaptive: bool = True):
        self.k_max, self.adaptive, self.drafter = k_max, adaptive, drafter
        self.costs = Costs()
        self.acceptance = Acceptance(drafter.prior)
        self.last: tuple[Hashable, int] | None = None
        self.idle = 0  # rounds since the last one that drafted
        self.reprobe: int | None = None  # idle rounds before a drafter too costly to pay is measured again
        self.rounds = 0  # rounds observed
        self.remeasure = False  # the next drafted round re-measures a verify cost recalled from another run
        self.held: dict[tuple[Hashable, int], int] = {}  # (context, k_max) -> the round its "plain" verdict ends

    def choose(self, ctx: Hashable | None, tokens_left: int) -> int:
        k_max = min(self.k_max, tokens_left - 1)  # the token after the drafts comes free: drafting more is waste
        k = 0
        if ctx is not None and k_max >= 1:
            if not self.adaptive:
                k = k_max
            elif not self.drafter.sits_out:
                k = self._adaptive(ctx, k_max)
        self.last = (ctx, k)
        return k

    def _adaptive(self, ctx: Hashable, k_max: int) -> int:
        if self.held.get((ctx, k_max), -1) < self.rounds:
            k = self._decide(ctx, k_max)
            if k:
                return k
        if self.reprobe is None:  # the drafter's last run left it (read after begin, which sets what is kept)
            self.reprobe = self.drafter.reprobe or REPROBE
        if self.idle < self.reprobe or 1 not in self.costs.verify:
            return 0
        if self.drafter.draft_cost != 0.0:
            self.reprobe *= 2  # a model's cost measurement is stale
            self.drafter.remember_reprobe(self.reprobe)
            self.costs.draft = []
            return 1
        if not any(t > 1 for t in self.costs.verify):
            # the verify cost that rules drafting out is another run's (recall), measured under another load (a
            # spike during its probes could put it past a step a position, where no draft pays): this probe
            # measures this run's, which then replaces it (observe)
            self.reprobe *= 2
            self.remeasure = True
            return 1
        return 0

    def _decide(self, ctx: Hashable, k_max: int) -> int:
        best = self.best(self.acceptance.estimates(ctx, k_max), k_max, MIN_GAIN)
        if best:
            if self.reprobe != REPROBE:
                self.reprobe = REPROBE
                self.drafter.remember_reprobe(REPROBE)
            return best
        if 1 not in self.costs.verify:
            return 0  # a probe is judged against a measured plain step
        if self.best(self.acceptance.estimates(ctx, k_max, z=1.0), k_max, MIN_GAIN, optimistic=True):
            return 1
        self.held[ctx, k_max] = self.rounds + HOLD
        return 0

    def draft_ms(self, optimistic: bool = False) -> float:
        ratio = self.drafter.draft_cost  # a draft's ms over a plain step's: a lookup's 0, or a recent measurement
        if self.costs.draft and ratio != 0.0:
            return self.costs.draft_ms()
        if ratio is not None:
            return ratio * self.costs.step
        return 0.0 if optimistic else math.inf  # a model's drafts are measured by the first probe

    def rates(self, a: list[float], optimistic: bool = False) -> list[float]:
        """Expected tokens per ms for k = 0..len(a)."""
        d, o = self.draft_ms(optimistic), self.costs.overhead_ms()
        e, v = expected_tokens(a), self.costs.table(len(a) + 1)
        return [e[0] / v[0]] + [e[k] / (o + k * d + v[k]) if d < math.inf else 0.0 for k in range(1, len(a) + 1)]

    def best(self, a: list[float], k_max: int, gain: float, optimistic: bool = False) -> int:
        rates = self.rates(a[:k_max], optimistic)
        k = max(range(len(rates)), key=rates.__getitem__)
        return k if rates[k] > gain * rates[0] else 0

    def recall(self, engine) -> None:
        """Start from the verify slope the engine's recent runs measured: this machine's, this load's."""
        self.costs.set_prior(recalled_slope(engine))

    def remember(self, engine) -> None:
        """Keep the slope this run measured (plain steps and verify passes both seen) for the engine's next runs."""
        slope = self.costs.measured_slope()
        if slope is not None:
            remember_slope(engine, slope)

    def observe(self, rnd) -> None:
        """Learn from the round just run (the one the last choose() was for)."""
        ctx, _ = self.last
        self.rounds += 1
        self.acceptance.age()
        if rnd.n_drafted == 0:
            self.costs.add_verify(1, rnd.total_ms)
            self.idle += 1
        else:
            self.costs.add_verify(rnd.n_drafted + 1, rnd.total_ms - rnd.draft_ms)
            if self.remeasure:  # the slope this run measured replaces the one recalled from another
                self.remeasure = False
                self.costs.set_prior(self.costs.measured_slope())
            self.costs.add_overhead(rnd.draft_ms - rnd.propose_ms)
            self.acceptance.observe(ctx, rnd.n_drafted, rnd.n_accepted)
            # its own evidence changed: judged afresh; the others' pooled evidence moved less, and waits out HOLD
            self.held = {key: end for key, end in self.held.items() if key[0] != ctx}
            if self.drafter.draft_cost != 0.0:  # a lookup's drafting is free; a model's is measured
                self.costs.add_draft(rnd.propose_ms / rnd.n_drafted)
            self.idle = 0
        if self.costs.draft:
            self.drafter.remember_cost(self.costs.draft_ms() / self.costs.step)


def remember_slope(engine, slope: float, now: float | None = None) -> None:
    """Keep a run's measured verify slope for the engine's next runs (the last SLOPES_KEPT)."""
    now = time.monotonic() if now is None else now
    SLOPES[engine] = (SLOPES.get(engine, []) + [(now, slope)])[-SLOPES_KEPT:]


def recalled_slope(engine, now: float | None = None) -> float:
    """The median slope of the engine's runs in the last SLOPE_TTL_S, else the prior."""
    now = time.monotonic() if now is None else now
    recent = [slope for when, slope in SLOPES.get(engine, []) if now - when < SLOPE_TTL_S]
    return median(recent) if recent else PRIOR_VERIFY_SLOPE
