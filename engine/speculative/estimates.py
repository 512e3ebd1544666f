"""What the adaptive schedule (schedule.py) estimates from a run's rounds: the round times it measured (Costs: a
plain step, a verify pass of each size, the drafter's share) and the acceptance per context and draft position
(Acceptance: decayed Beta posteriors shrunk toward the run's other contexts and the drafter's prior), and E(k),
the tokens a round of k drafts is expected to emit. docs/SPECULATIVE.md has the model.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Hashable
from dataclasses import dataclass, field

PRIOR_WEIGHT = 2.0  # a context's prior counts as two rounds of evidence
POOL = 0.5  # at positions past the first, another context's round counts half as much as the context's own
DECAY = 0.99  # per round: about the last 100 rounds carry the estimates; a ruled-out context is probed again
# once decay has worn its counts under the bar, about 1% of a run's time whatever a probe costs (every ~50 rounds
# at a probe costing half a step, every ~7 at 7% of one)
WINDOW = 8  # rounds a cost estimate keeps
PRIOR_VERIFY_SLOPE = 0.15  # V(T) = V(1) * (1 + 0.15 (T - 1)) until this engine's verify passes are measured


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
