"""A round that does not draft, inside a speculative run, does the work of a plain decode step: the same torch
ops dispatched and the same engine calls, plus the drafter's lookup and the schedule's choice in Python. On open
text most rounds are such rounds, so anything more is paid on nearly every token. A drafter that does device
work in its lookup must fail the same check."""
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import Engine, load_model, speculative
from engine.speculative import loop
from engine.speculative.estimates import Acceptance
from engine.speculative.schedule import HOLD
from engine.tiny import tiny_config, write_tiny_model
from schedules import Modeled
from test_schedule import CPU_TWINS, Fake, simulate

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 44, 32, 104, 101, 108, 108, 111, 32]
ENGINE_CALLS = ("prefill", "decode", "chunk", "pick", "rollback")


class Work(TorchDispatchMode):
    """Every torch op dispatched, and every call into the engine, by name."""

    def __init__(self, eng, monkeypatch):
        super().__init__()
        self.ops = Counter()
        for name in ENGINE_CALLS:
            monkeypatch.setattr(eng, name, self.counted(name, getattr(eng, name)))

    def counted(self, name, fn):
        def call(*args, **kwargs):
            self.ops["engine." + name] += 1
            return fn(*args, **kwargs)
        return call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def per_round(rounds, work):
    """(Round, the work its step of the generator did) for each round after the prefill."""
    out, it = [], iter(rounds)
    while True:
        before = Counter(work.ops)
        with work:
            rnd = next(it, None)
        if rnd is None:
            return out[1:]
        out.append((rnd, work.ops - before))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_tiny_model(tmp_path_factory.mktemp("plain-round") / "m", tiny_config(), seed=1))


class EveryOther(Modeled):
    """Drafts as much as it may every other round, and makes the rounds between plain steps."""

    def _adaptive(self, ctx, k_max):
        self.turn = not getattr(self, "turn", False)
        return k_max if self.turn else 0


class Probing(speculative.NgramDrafter):
    """The lookup with a device op in its context(): the kind of work a plain round must not carry."""

    def context(self):
        torch.zeros(1).add_(1)
        return super().context()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_plain_round_does_the_work_of_a_plain_step(tiny, monkeypatch, temperature):
    monkeypatch.setattr(loop, "Schedule", Modeled)  # drafting rounds and plain ones, whatever the box's load
    eng = Engine(tiny, max_seq_len=256)
    work = Work(eng, monkeypatch)
    steps = [w for _, w in per_round(eng.stream(PROMPT, 40, temperature=temperature, stop_ids=[]), work)]
    assert len(steps) == 39 and all(w == steps[0] for w in steps[:-1])
    step = steps[0]
    assert step["engine.decode"] == 1 and step["engine.pick"] == 1 and len(step) > 3

    def plain_rounds(drafter, k=8):
        rounds = per_round(speculative.stream(eng, drafter, PROMPT, k=k, max_new_tokens=40, temperature=temperature,
                                              stop_ids=[]), work)
        assert any(r.n_drafted for r, _ in rounds), "the run never drafted: the check says nothing"
        return [w for r, w in rounds if not r.n_drafted]

    # the lookup; then the drafters over the target's own cache (layer skipping, a copy of the checkpoint), which
    # the modeled schedule would have draft every round: they draft 2 every other round
    for drafter in (speculative.NgramDrafter(), speculative.LayerSkipDrafter(eng, layers=[0, 2]),
                    speculative.ModelDrafter(Engine(tiny, max_seq_len=256))):
        if drafter.name != "ngram":
            monkeypatch.setattr(loop, "Schedule", EveryOther)
        plain = plain_rounds(drafter, k=2)
        assert len(plain) >= 8, drafter.name
        # a noise row drawn ahead by a verify pass is kept: a plain round after it may draw less, never more
        assert all(w <= step for w in plain), (drafter.name, [w - step for w in plain if not w <= step])
        if temperature == 0:
            assert all(w == step for w in plain), drafter.name
    assert not all(w <= step for w in plain_rounds(Probing()))


def test_a_plain_verdict_is_held_and_aging_is_deferred(monkeypatch):
    """Where drafting does not pay, the schedule decides afresh at most once per HOLD rounds per context; the
    rounds in between cost a dict probe (no posterior, no cost table, no pass over the counts)."""
    calls = Counter()
    estimates = Acceptance.estimates

    def counted(self, *args, **kwargs):
        calls["estimates"] += 1
        return estimates(self, *args, **kwargs)

    monkeypatch.setattr(Acceptance, "estimates", counted)
    schedule = loop.Schedule(8, Fake(draft_cost=0.0, prior=0.1))
    _, ks = simulate(schedule, 0.0, CPU_TWINS, rounds=400)
    drafted = sum(k > 0 for k in ks)
    # each decision reads the posterior twice (means, then the optimistic bound), and a drafted round clears
    # the verdicts: at most one decision per HOLD rounds, and one after each drafted round
    assert calls["estimates"] <= 2 * (400 // HOLD + 2 * drafted + 2), (calls, drafted)
    assert schedule.acceptance.unaged <= HOLD
