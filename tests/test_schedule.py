"""The adaptive schedule on its own: its formula, its cost and acceptance estimates, and its choices in a
simulated machine whose costs and acceptance are known, so what it earns can be set against plain decoding
and against the best fixed k."""
import random

import pytest

from engine.speculative.drafters import Drafter
from engine.speculative.estimates import PRIOR_VERIFY_SLOPE, Acceptance, Costs, expected_tokens, median
from engine.speculative.schedule import REPROBE, SLOPE_TTL_S, SLOPES, Schedule, recalled_slope, remember_slope
from engine.stats import Round


def test_expected_tokens():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([1.0, 1.0, 1.0]) == [1, 2, 3, 4]
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1, 1.5, 1.75])
    assert expected_tokens([0.0, 1.0]) == [1, 1, 1]


def test_costs_median_interpolate_and_extrapolate():
    c = Costs()
    assert c.step == 1.0 and c.verify_ms(3) == pytest.approx(1.3)  # nothing measured: priors in units of a step
    c.add_verify(3, 13)
    assert c.step == pytest.approx(10) and c.verify_ms(3) == pytest.approx(13)  # a step inferred by the prior
    for ms in (10, 11, 50, 9, 10):  # one outlier among plain steps
        c.add_verify(1, ms)
    assert c.step == 10
    c.add_verify(3, 16)  # a size's median counts the prior (10 * 1.3) as one more round
    assert c.verify_ms(3) == pytest.approx(13)  # median of 13, 16 and the prior 13
    c.add_verify(3, 18)
    assert c.verify_ms(3) == pytest.approx(14.5)
    assert c.verify_ms(2) == pytest.approx(12.25)  # halfway between V(1) and V(3)
    # past the largest size seen: the smaller of the measured slope (2.25 ms) and the prior's (1.5 ms)
    assert c.verify_ms(5) == pytest.approx(14.5 + 2 * 1.5)
    for _ in range(6):
        c.add_verify(3, 10.6)  # verify passes turn out nearly free: the slope follows
    assert c.verify_ms(5) == pytest.approx(10.6 + 2 * 0.3)
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5



def test_cost_table_follows_every_measurement():
    """The table a round reads (its sizes sorted once, each size's median kept until the next measurement) equals
    V(T) computed afresh, after every measurement of a random sequence: nothing it keeps goes stale."""
    rng = random.Random(7)
    c = Costs()
    for _ in range(200):
        c.add_verify(rng.choice([1, 1, 2, 3, 5, 8, 13]), rng.uniform(5, 30))
        if rng.random() < 0.05:
            c.set_prior(rng.uniform(0.05, 0.4))
        table = c.table(17)
        fresh = Costs(verify={t: list(v) for t, v in c.verify.items()}, prior_slope=c.prior_slope)
        assert table == [fresh.verify_ms(T) for T in range(1, 18)]

def test_acceptance_posterior_by_position():
    a = Acceptance(lambda ctx: 0.5)
    assert a.estimates("x", 3) == [0.5, 0.5, 0.5]
    for _ in range(10):
        a.observe("x", 3, 3)  # every draft accepted
    est = a.estimates("x", 5)
    assert all(0.9 < e < 1 for e in est) and est[3] == est[4]  # unseen positions take the continuation mean
    a.observe("y", 4, 1)  # position 0 accepted, position 1 rejected, 2 and 3 never judged
    assert a.counts["y"] == [[1, 0], [0, 1]]
    low = a.estimates("y", 3)
    high = a.estimates("y", 3, z=1.0)
    assert low[1] < low[2] and all(h > m for h, m in zip(high, low, strict=True))
    # "x"'s evidence lifts "y"'s prior (at half weight), its own rejection at position 1 pulls that one down
    assert low[0] > 0.8 and low[1] < low[0]
    assert a.estimates("z", 1)[0] > 0.8  # a context never seen starts from the run's other contexts
    before = a.counts["x"][0][0]
    a.age()
    assert a.counts["x"][0][0] < before


def test_a_drafter_degrading_with_depth_shows_it_where_counted():
    a = Acceptance(lambda ctx: 0.5)
    for _ in range(30):
        a.observe("m", 4, 4)
        a.observe("m", 4, 2)  # positions 0 and 1 always kept, position 2 kept half the time, 3 when reached
    est = a.estimates("m", 4)
    assert est[0] > 0.9 and est[1] > 0.9 and 0.4 < est[2] < 0.6


class Fake(Drafter):
    def __init__(self, draft_cost=None, prior=0.5):
        self.draft_cost, self._prior, self.remembered = draft_cost, prior, None

    def prior(self, key):
        return self._prior

    def remember_cost(self, ratio):
        self.remembered = ratio


def simulate(schedule, alpha, verify, draft=0.0, rounds=300, seed=0, tokens_left=10**6, overhead=0.0):
    """Rounds on a machine with plain step verify[1] ms, verify passes verify[T] ms, draft ms per token (a number,
    or a function of the round's index: the machine's load changing), a drafting round's fixed drafter overhead
    (catch-up and commit) and conditional acceptance alpha (one value, or one per position). Returns (tokens per
    ms, ks chosen)."""
    rng, t, tokens, ks = random.Random(seed), 0.0, 0, []
    for i in range(rounds):
        k = schedule.choose(0, tokens_left)
        ks.append(k)
        n = 0
        while n < k and rng.random() < (alpha[n] if isinstance(alpha, list) else alpha):
            n += 1
        d = draft(i) if callable(draft) else draft
        drafter_ms = 0.0 if k == 0 else overhead + k * d
        ms = verify[1] if k == 0 else drafter_ms + verify[k + 1]
        schedule.observe(Round(i + 1, [], t, t + ms, draft_ms=drafter_ms, propose_ms=k * d, n_drafted=k, k=k,
                               verified=n))
        t, tokens = t + ms, tokens + n + 1
    return tokens / t, ks


def best_fixed(alpha, verify, draft, k_max):
    a = [alpha] * k_max
    return max(expected_tokens(a[:k])[k] / (k * draft + verify[k + 1]) for k in range(k_max + 1))


CPU_TWINS = {T: 1 + 0.5 * (T - 1) if T < 6 else 3.5 + 0.1 * (T - 6) for T in range(1, 18)}  # like this box
KERNELS = {T: 1 + 0.05 * (T - 1) for T in range(1, 18)}  # a verify pass streaming the weights once


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.3])
def test_a_poor_drafter_costs_almost_nothing(alpha):
    """Where drafting cannot pay, the schedule makes plain steps after a few one-draft probes."""
    rate, ks = simulate(Schedule(8, Fake(draft_cost=0.0, prior=0.5)), alpha, CPU_TWINS)
    assert rate >= 0.97 * (1 / CPU_TWINS[1]), (rate, ks)
    # after the first rounds on priors, probes of one draft in fewer than one round in ten (a lucky probe that
    # is accepted earns the next few their own)
    assert max(ks[5:]) <= 1 and sum(ks) <= 30


@pytest.mark.parametrize("verify", [CPU_TWINS, KERNELS], ids=["cpu-twins", "kernels"])
@pytest.mark.parametrize("alpha", [0.6, 0.9, 0.98])
def test_a_good_lookup_earns_near_the_best_fixed_k(alpha, verify):
    rate, ks = simulate(Schedule(8, Fake(draft_cost=0.0)), alpha, verify, seed=int(alpha * 100))
    best = best_fixed(alpha, verify, 0.0, 8)
    assert rate >= 0.85 * best and rate >= 0.97 / verify[1], (rate, best, ks[-20:])


def test_a_model_drafter_too_slow_is_probed_again_later():
    """A draft costing 5 plain steps (a q4 model on the torch twins): a plain step to judge the probe against,
    the probe, then plain steps, and another probe of one draft once the measurement is REPROBE rounds stale,
    then after twice as many; the next run knows the cost (drafter.draft_cost) and skips the first probe."""
    drafter = Fake()
    rate, ks = simulate(Schedule(8, drafter), 1.0, CPU_TWINS, draft=5.0, rounds=120)
    probes = [i for i, k in enumerate(ks) if k]
    assert probes == [1, 2 + REPROBE, 3 + 3 * REPROBE] and set(ks) == {0, 1}, probes
    assert drafter.remembered == pytest.approx(5.0)
    assert rate > 0.9 / CPU_TWINS[1]  # three probes at ~5 steps each in 120 rounds
    drafter.draft_cost = drafter.remembered
    _, ks = simulate(Schedule(8, drafter), 1.0, CPU_TWINS, draft=5.0, rounds=60)
    assert [i for i, k in enumerate(ks) if k] == [REPROBE], ks


class Remembering(Fake):
    """A drafter kept between runs: it keeps the schedule's wait before a re-measurement, as ModelDrafter does."""
    def __init__(self, **kw):
        super().__init__(**kw)
        self.reprobe = None

    def remember_reprobe(self, rounds):
        self.reprobe = rounds


def test_runs_in_a_row_carry_the_wait_before_a_reprobe():
    """A slow drafter kept between runs starts the next run at the wait its last run reached (its cost still
    trusted), so short runs in a row do not each pay a probe at REPROBE; once a probe finds drafting pays, the
    wait is REPROBE again."""
    drafter = Remembering()
    simulate(Schedule(8, drafter), 1.0, CPU_TWINS, draft=5.0, rounds=120)
    assert drafter.reprobe == 4 * REPROBE  # probes at 1, 2 + REPROBE and 3 + 3 * REPROBE, each doubling the wait
    drafter.draft_cost = drafter.remembered
    _, ks = simulate(Schedule(8, drafter), 1.0, CPU_TWINS, draft=5.0, rounds=60)
    assert not any(ks)  # REPROBE rounds into it, a run that forgot would have probed
    _, ks = simulate(Schedule(8, drafter), 1.0, CPU_TWINS, draft=5.0, rounds=200)
    assert [i for i, k in enumerate(ks) if k] == [4 * REPROBE] and drafter.reprobe == 8 * REPROBE
    drafter.draft_cost = None  # the measurement expired (ModelDrafter: COST_TTL_S): the next run measures
    _, ks = simulate(Schedule(8, drafter), 0.97, KERNELS, draft=0.25, rounds=60)
    assert ks[1] == 1 and sum(ks) > 60 and drafter.reprobe == REPROBE


def test_a_model_drafter_keeps_the_wait_while_its_cost_is_trusted(monkeypatch):
    from engine.speculative import drafters

    d = drafters.ModelDrafter(None)
    d.remember_reprobe(128)
    assert d.reprobe is None  # no cost measured: nothing to trust
    d.remember_cost(3.0)
    assert d.reprobe == 128
    clock = drafters.time.monotonic() + drafters.COST_TTL_S + 1
    monkeypatch.setattr(drafters.time, "monotonic", lambda: clock)
    assert d.draft_cost is None and d.reprobe is None


def test_a_drafter_found_slow_is_used_once_the_load_lets_it_pay():
    """Another job slows the draft model to 5 steps a token for the first 20 rounds, then leaves: the re-probe
    measures the cheaper draft and the schedule drafts from then on."""
    rate, ks = simulate(Schedule(8, Fake()), 0.97, KERNELS, draft=lambda i: 5.0 if i < 20 else 0.25, rounds=200)
    assert sum(ks[:20]) == 1 and min(ks[REPROBE + 3:]) >= 2, ks
    assert rate > 1.3 / KERNELS[1]


def test_the_draft_cost_is_the_drafting_alone():
    """A model drafter whose rounds also pay a catch-up (a chunk of the tokens plain rounds emitted, the last
    commit): the per-token cost the schedule weighs is Round.propose_ms / n_drafted, the catch-up a fixed cost
    of a drafting round, so a cheap drafter with a costly catch-up still drafts, and long."""
    s = Schedule(8, Fake())
    rate, ks = simulate(s, 0.95, KERNELS, draft=0.2, overhead=1.5)
    assert s.draft_ms() == pytest.approx(0.2) and s.costs.overhead_ms() == pytest.approx(1.5)
    assert sorted(ks[-50:])[25] >= 6, ks[-20:]
    best = max(expected_tokens([0.95] * k)[k] / (1.5 + 0.2 * k + KERNELS[k + 1]) for k in range(1, 9))
    assert rate >= 0.85 * best


@pytest.mark.parametrize("verify", [CPU_TWINS, KERNELS], ids=["cpu-twins", "kernels"])
def test_a_cheap_faithful_model_drafter_pays(verify):
    """A draft at a quarter of a step that the target almost always accepts (quantized self-drafting once the
    kernels land): the schedule finds a k near the best."""
    rate, ks = simulate(Schedule(8, Fake()), 0.97, verify, draft=0.25)
    best = best_fixed(0.97, verify, 0.25, 8)
    assert rate >= 0.85 * best and best > 1.3 / verify[1], (rate, best, ks[-10:])


def test_position_dependent_acceptance():
    """A drafter good for two tokens and bad after: k settles at 2 or 3, not at the maximum."""
    alpha = [0.95, 0.95, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    rate, ks = simulate(Schedule(8, Fake(draft_cost=0.0)), alpha, KERNELS, rounds=400)
    assert 2 <= sorted(ks[-100:])[50] <= 3, ks[-20:]


def test_limits():
    s = Schedule(5, Fake(draft_cost=0.0, prior=0.99))
    s.costs.add_verify(1, 10.0)
    assert s.choose(None, 100) == 0  # nothing to propose
    assert s.choose(0, 1) == 0  # one token left: a plain step
    assert s.choose(0, 3) <= 2  # never more drafts than the tokens left less one
    fixed = Schedule(5, Fake(), adaptive=False)
    assert fixed.choose(0, 100) == 5 and fixed.choose(0, 4) == 3 and fixed.choose(None, 100) == 0
    assert Schedule(5, Fake()).choose(0, 100) == 0  # a model's draft cost is unknown: a plain step, then a probe
    # a free lookup with a good prior drafts from the first round, on prior costs in units of a step
    assert Schedule(5, Fake(draft_cost=0.0, prior=0.9)).choose(0, 100) > 1


def test_a_run_starts_from_the_verify_slope_the_engine_last_measured():
    class Engine:  # any object the runs share
        pass

    eng, other = Engine(), Engine()
    first = Schedule(8, Fake(draft_cost=0.0))
    first.recall(eng)
    assert first.costs.prior_slope == PRIOR_VERIFY_SLOPE  # nothing measured on this engine yet
    simulate(first, 0.3, CPU_TWINS, rounds=60)  # probes, and plain steps
    first.remember(eng)
    second, third = Schedule(8, Fake(draft_cost=0.0)), Schedule(8, Fake(draft_cost=0.0))
    second.recall(eng)
    third.recall(other)
    # CPU_TWINS: a verify pass costs 0.5 of a step per position up to 6 positions, flatter past them
    assert 0.2 < second.costs.prior_slope <= 0.5 and third.costs.prior_slope == PRIOR_VERIFY_SLOPE
    assert second.costs.verify_ms(3) == pytest.approx(1 + 2 * second.costs.prior_slope)


@pytest.mark.parametrize("stale", [1.2, 3.0])
def test_a_verify_cost_remembered_from_a_spike_is_measured_again(stale):
    """An earlier run on the engine measured its verify passes under a load spike (a slope past a step per
    position, where no draft can pay): a good lookup's next run probes once the wait is up, finds the passes
    cheap, drafts, and leaves its own slope for the run after; on an engine where they really cost that much,
    one probe a run."""
    class Engine:
        pass

    eng = Engine()
    remember_slope(eng, stale)
    s = Schedule(8, Fake(draft_cost=0.0, prior=0.9))
    s.recall(eng)
    rate, ks = simulate(s, 0.9, KERNELS, rounds=200)
    first = next((i for i, k in enumerate(ks) if k), None)
    assert first == REPROBE and sum(ks[first + 10:]) > 5 * (200 - first - 10), ks
    s.remember(eng)
    assert SLOPES[eng][-1][1] < 0.1
    SLOPES[eng] = []
    remember_slope(eng, stale)
    costly = {T: 1 + stale * (T - 1) for T in range(1, 18)}
    s = Schedule(8, Fake(draft_cost=0.0, prior=0.9))
    s.recall(eng)
    _, ks = simulate(s, 0.9, costly, rounds=200)
    assert [k for k in ks if k] == [1], ks


def test_a_run_starts_from_the_median_of_the_engines_recent_slopes():
    """One run measured under a load spike does not set the next runs' start, and old measurements expire."""
    class Engine:
        pass

    eng = Engine()
    assert recalled_slope(eng) == PRIOR_VERIFY_SLOPE
    for t, slope in enumerate([0.3, 0.32, 2.5, 0.31]):
        remember_slope(eng, slope, now=100.0 + t)
    assert recalled_slope(eng, now=110.0) == pytest.approx(0.315)  # the spike is outvoted
    for t in range(6):
        remember_slope(eng, 0.5, now=200.0 + t)
    assert len(SLOPES[eng]) == 5 and recalled_slope(eng, now=210.0) == 0.5  # the last five kept
    assert recalled_slope(eng, now=205.0 + SLOPE_TTL_S) == PRIOR_VERIFY_SLOPE  # all too old: the prior
