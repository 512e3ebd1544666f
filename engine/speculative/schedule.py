"""The adaptive draft length: each speculative round drafts the k (0 = a plain decode step) with the most
expected tokens per second, E(k) / C(k), judged from this run's measured verify costs, draft costs and
per-context acceptance (decayed Beta posteriors), probing with one draft where an optimistic bound says drafting
could pay. A drafter tells the schedule its context(), prior(context) and draft_cost (drafters.py). The model,
its priors and when it probes: docs/SPECULATIVE.md.
"""
from __future__ import annotations

import bisect
import math
import time
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field

MIN_GAIN = 1.05  # k > 0 must beat a plain step's expected tok/s by 5%: estimates are noisy and the best-looking
# k is biased upward by being picked, so a break-even draft would lose more often than it wins
PRIOR_WEIGHT = 2.0  # a context's prior counts as two rounds of evidence
POOL = 0.5  # at positions past the first, another context's round counts half as much as the context's own
DECAY = 0.99  # per round: about the last 100 rounds carry the estimates; a ruled-out context is probed again
# once decay has worn its counts under the bar, about 1% of a run's time whatever a probe costs (every ~50 rounds
# at a probe costing half a step, every ~7 at 7% of one)
WINDOW = 8  # rounds a cost estimate keeps
PRIOR_VERIFY_SLOPE = 0.15  # V(T) = V(1) * (1 + 0.15 (T - 1)) until this engine's verify passes are measured
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


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass
class Costs:
    """Measured round times, ms: the median of the last WINDOW rounds of each kind (a shared CPU's round times
    jump with other jobs' load; a median shrugs off the outliers an average would carry for rounds).

    verify[T]: rounds that verified T positions, their time less the drafter's (T = 1: plain steps, whole);
    draft: proposal time per drafted token; overhead: the rest of a drafting round's drafter time."""
    verify: dict[int, list[float]] = field(default_factory=dict)
    draft: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)
    _table: list[float] = field(default_factory=list, repr=False)  # V(1..) since the last measurement added
    _memo: dict[str | int, float] = field(default_factory=dict, repr=False)  # step, slope, measured(T): likewise
    prior_slope: float = PRIOR_VERIFY_SLOPE  # a verify position's cost over a step's, before this run measures it

    @property
    def step(self) -> float:
        """A plain step's ms: measured; else inferred from the verify passes measured, by the prior slope;
        else 1 (before any round every cost is a prior relative to a step, and relative units do)."""
        if "step" not in self._memo:
            seen = [median(v) / (1 + self.prior_slope * (t - 1)) for t, v in self.verify.items()]
            self._memo["step"] = median(self.verify[1]) if 1 in self.verify else min(seen) if seen else 1.0
        return self._memo["step"]

    def measured_slope(self) -> float | None:
        """This run's verify slope per step: the mean over the sizes seen past 1 of (V(T) / V(1) - 1) / (T - 1),
        at least 0; None before a plain step and a verify pass are both measured."""
        if 1 not in self.verify or not any(t > 1 for t in self.verify):
            return None
        slopes = [(median(v) / self.step - 1) / (t - 1) for t, v in self.verify.items() if t > 1]
        return max(0.0, sum(slopes) / len(slopes))

    def set_prior(self, slope: float) -> None:
        self.prior_slope, self._table, self._memo = slope, [], {}

    def add_verify(self, T: int, ms: float) -> None:
        self.verify[T] = (self.verify.get(T, []) + [ms])[-WINDOW:]
        self._table, self._memo = [], {}

    def add_draft(self, ms: float) -> None:
        self.draft = (self.draft + [ms])[-WINDOW:]

    def add_overhead(self, ms: float) -> None:
        self.overhead = (self.overhead + [ms])[-WINDOW:]

    def overhead_ms(self) -> float:
        return median(self.overhead) if self.overhead else 0.0

    def draft_ms(self) -> float | None:
        return median(self.draft) if self.draft else None

    def measured(self, T: int) -> float:
        """A size's median, with the prior counted as one more round: one noisy round does not settle it."""
        if T == 1:
            return self.step
        if T not in self._memo:
            self._memo[T] = median(self.verify[T] + [self.step * (1 + self.prior_slope * (T - 1))])
        return self._memo[T]

    def slope(self) -> float:
        """Extra ms per verified position past the largest size seen: the smaller of the mean slope measured and
        the prior's. Verify passes flatten as T grows (on a CPU a matmul over a few rows re-reads the weights per
        row; past a few rows the GEMM streams them once), so the early slope would keep larger k from ever being
        tried; the first round at a new size measures it."""
        if "slope" not in self._memo:
            step = self.step
            seen = [(self.measured(t) - step) / (t - 1) for t in self.verify if t > 1]
            prior = self.prior_slope * step
            self._memo["slope"] = max(0.0, min(prior, sum(seen) / len(seen))) if seen else prior
        return self._memo["slope"]

    def table(self, n: int) -> list[float]:
        """[V(1), ..., V(n)], computed once per measurement added."""
        if len(self._table) < n:
            seen = sorted(self.verify)
            self._table = [self.verify_ms(T, seen) for T in range(1, n + 1)]
        return self._table

    def verify_ms(self, T: int, seen: list[int] | None = None) -> float:
        """V(T): measured where seen, linear between the nearest sizes seen (seen: sorted(self.verify), a table's
        once for all its T), extrapolated past the largest."""
        if T == 1 or T in self.verify:
            return self.measured(T)
        seen = sorted(self.verify) if seen is None else seen
        i = bisect.bisect(seen, T)  # seen[:i] lie below T, seen[i:] above it
        below = seen[i - 1] if i else 1
        if i == len(seen):
            return self.measured(below) + self.slope() * (T - below)
        hi = seen[i]
        lo_ms, hi_ms = self.measured(below), self.measured(hi)
        return lo_ms + (hi_ms - lo_ms) * (T - below) / (hi - below)


class Acceptance:
    """Decayed accept / reject counts per (context, draft position), read as Beta posteriors shrunk toward a
    hierarchy of means:
      position 0     the drafter's prior for the context, its odds scaled by how the run's other contexts did
                     against their own priors: the contexts of one run share its nature (in a copy task even a
                     one-token match is usually right; in free prose even a long one often is not), while a
                     context's prior keeps what sets it apart (a long match is better evidence than a short one);
      continuation   positions 1.. pooled (this context's at full weight, the others' at POOL), shrunk toward
                     position 0's mean: once a draft is accepted the next one tends to be too, and a round that
                     accepts three drafts teaches three continuations, not one position each;
      position i     its own counts, shrunk toward the continuation mean, so a drafter whose drafts degrade
                     with depth (a truncated model) shows it where the counts are."""

    def __init__(self, prior):
        self.prior = prior  # context -> prior mean acceptance
        self._counts: dict[Hashable, list[list[float]]] = {}  # context -> [[accepted, rejected] per position]
        self.unaged = 0  # rounds whose decay is not yet applied to the counts

    @property
    def counts(self) -> dict[Hashable, list[list[float]]]:
        """The counts with every round's decay applied. Aging is deferred to the next read: a run of plain rounds
        whose choice the schedule holds (Schedule.HOLD) reads nothing, so a round pays O(1) for it."""
        if self.unaged:
            f, self.unaged = DECAY ** self.unaged, 0
            for rows in self._counts.values():
                for row in rows:
                    row[0] *= f
                    row[1] *= f
        return self._counts

    def observe(self, ctx: Hashable, n_drafted: int, n_accepted: int) -> None:
        rows = self.counts.setdefault(ctx, [])
        for p in range(min(n_drafted, n_accepted + 1)):  # the verify pass judged positions 0..n_accepted
            if p == len(rows):
                rows.append([0.0, 0.0])
            rows[p][p >= n_accepted] += 1

    def age(self) -> None:
        self.unaged += 1

    def _pooled(self, ctx: Hashable) -> tuple[float, float]:
        """(accepted, rejected) at positions 1.. of ctx, plus the other contexts' at POOL weight."""
        acc = rej = 0.0
        for c, rows in self.counts.items():
            w = 1.0 if c == ctx else POOL
            for row in rows[1:]:
                acc, rej = acc + w * row[0], rej + w * row[1]
        return acc, rej

    def first_prior(self, ctx: Hashable) -> float:
        """ctx's prior at position 0 with its odds scaled by the run: the other contexts' accepted (and rejected)
        first drafts over what their priors expected, each ratio smoothed by PRIOR_WEIGHT expected rounds."""
        accepted = judged = expected = 0.0
        for c, rows in self.counts.items():
            if c != ctx and rows:
                accepted, judged = accepted + rows[0][0], judged + rows[0][0] + rows[0][1]
                expected += (rows[0][0] + rows[0][1]) * self.prior(c)
        up = (accepted + PRIOR_WEIGHT) / (expected + PRIOR_WEIGHT)
        down = (judged - accepted + PRIOR_WEIGHT) / (judged - expected + PRIOR_WEIGHT)
        m = self.prior(ctx)
        return m * up / (m * up + (1 - m) * down)

    def estimates(self, ctx: Hashable, k: int, z: float = 0.0) -> list[float]:
        """Posterior mean (+ z standard deviations, capped at 1) at positions 0..k-1."""
        rows = self.counts.get(ctx, [])

        def posterior(prior: float, p: int) -> tuple[float, float]:
            acc, rej = rows[p] if p < len(rows) else (0.0, 0.0)
            return PRIOR_WEIGHT * prior + acc, PRIOR_WEIGHT * (1 - prior) + rej

        a0, b0 = posterior(self.first_prior(ctx), 0)
        acc, rej = self._pooled(ctx)
        continuation = (PRIOR_WEIGHT * a0 / (a0 + b0) + acc) / (PRIOR_WEIGHT + acc + rej)
        out = []
        for p in range(k):
            a, b = (a0, b0) if p == 0 else posterior(continuation, p)
            sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))) if z else 0.0
            out.append(min(1.0, a / (a + b) + z * sd))
        return out


def expected_tokens(a: list[float]) -> list[float]:
    """E(k) for k = 0..len(a): tokens a round of k drafts emits, given conditional acceptances a."""
    out, run = [1.0], 1.0
    for x in a:
        run *= x
        out.append(out[-1] + run)
    return out


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
