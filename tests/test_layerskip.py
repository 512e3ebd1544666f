"""The layer-skip drafter over its target's own KV cache: no cache of its own, no catch-up after plain rounds,
and never a write into a position the target has committed."""
import time
from collections import Counter

import pytest
import torch

from engine import Engine, speculative
from engine.checkpoint import random_model
from engine.speculative import layerskip, loop, schedule
from engine.speculative.layerskip import calibrate, drafted, influence
from engine.sampling import SamplingParams, probs
from engine.stats import EMITTED_KINDS
from engine.tiny import tiny_config
from schedules import RandomK
from ui.explain import schedule_note

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 44, 32, 104, 101, 108, 108, 111, 32]


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(), weights="fp32", seed=3)


def test_the_view_runs_on_the_targets_cache(model):
    eng = Engine(model, 128)
    drafter = speculative.LayerSkipDrafter(eng, layers=[0, 2])
    view = drafter.engine.cache
    assert [t.data_ptr() for t in view.layer_k] == [eng.cache.layer_k[i].data_ptr() for i in (0, 2)]
    assert [t.data_ptr() for t in view.layer_v] == [eng.cache.layer_v[i].data_ptr() for i in (0, 2)]
    assert view.seq_lens.data_ptr() != eng.cache.seq_lens.data_ptr()
    assert view.bytes_per_token == eng.cache.bytes_per_token // 2


def test_it_runs_on_the_cache_of_the_engine_it_was_built_on_only(model):
    eng = Engine(model, 128)
    drafter = speculative.LayerSkipDrafter(eng, layers=[0, 2])
    assert drafter.on_cache_of(eng)
    with pytest.raises(ValueError, match="built on another engine"):
        speculative.generate(Engine(model, 128), drafter, PROMPT, k=2, max_new_tokens=4)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_proposal_is_k_steps_whatever_came_before(model, monkeypatch, temperature):
    """Rounds of random k, plain ones among them: each proposal is k view steps (no catch-up of the tokens the
    plain rounds emitted), the output is plain decoding's, and the target's cache over the committed positions
    holds what plain decoding wrote there (a draft written below the target's length would differ wildly)."""
    monkeypatch.setattr(loop, "Schedule", RandomK)
    eng = Engine(model, 128)
    want, _ = eng.generate(PROMPT, 48, temperature=temperature, seed=5, stop_ids=[])
    n = eng.length
    plain_k, plain_v = eng.cache.k[:, :, :, :n].clone(), eng.cache.v[:, :, :, :n].clone()
    eng.cache.k.normal_(), eng.cache.v.normal_()  # whatever a last run left
    drafter = speculative.LayerSkipDrafter(eng, layers=[1, 3])
    steps = Counter()
    for name in ("decode", "chunk"):
        fn = getattr(drafter.engine, name)
        monkeypatch.setattr(drafter.engine, name, lambda *a, _fn=fn, _name=name: steps.update([_name]) or _fn(*a))
    rounds = list(loop.stream(eng, drafter, PROMPT, k=6, max_new_tokens=48, temperature=temperature, seed=5,
                              stop_ids=[]))
    got = [t.token_id for r in rounds for t in r.tokens if t.kind in EMITTED_KINDS]
    assert got == want
    drafting = [r for r in rounds[1:] if r.n_drafted]
    assert drafting and len(drafting) < len(rounds) - 1, "random k drew no plain rounds, or no drafting ones"
    assert steps == Counter(decode=sum(r.n_drafted for r in drafting))
    assert eng.length == n
    torch.testing.assert_close(eng.cache.k[:, :, :, :n], plain_k, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(eng.cache.v[:, :, :, :n], plain_v, rtol=1e-4, atol=1e-5)


def test_calibration_drafts_over_the_targets_cache(model):
    """A candidate's distributions are the view's over the target's K/V of the positions before the window;
    keeping every layer gives the target's own, and a view that ran over its own K/V would not."""
    ids = PROMPT * 2
    scores, logits, cache = influence(model, ids, 8)
    all_layers = list(range(model.config.n_layers))
    torch.testing.assert_close(drafted(model, all_layers, ids, 8, cache), logits, rtol=1e-4, atol=1e-4)
    cal = calibrate(model, ids, SamplingParams(0.0))
    assert 1 <= len(cal.keep) < model.config.n_layers and len(scores) == model.config.n_layers
    assert set(cal.candidates) and all(0 <= a <= 1 for a in cal.candidates.values())


@pytest.mark.parametrize("head, slope", [(0.9, 0.15), (0.0, 0.0)])
def test_a_calibrated_set_that_cannot_pay_sits_the_run_out(model, monkeypatch, head, slope):
    """Where the kept layers' modeled draft cost plus a verify position's cost is a step or more, no k can pay:
    the adaptive schedule makes every round a plain step (no probe, no proposal: unmeasured, the draft's cost
    would be probed) and the page says why; a fixed k still drafts every round. Below a step the schedule probes
    as before. `head`: the share of a step the head is taken to read."""
    monkeypatch.setattr(layerskip, "step_share", lambda model: head)
    eng = Engine(model, 128)
    ids = PROMPT * 2
    want, _ = eng.generate(ids, 32, stop_ids=[])
    drafter = speculative.LayerSkipDrafter(eng)
    proposals = Counter()
    propose = drafter.propose
    monkeypatch.setattr(drafter, "propose", lambda *a: proposals.update([1]) or propose(*a))
    schedule.SLOPES[eng] = [(time.monotonic(), slope)]  # what the engine's recent runs measured
    got, stats = speculative.generate(eng, drafter, ids, k=4, max_new_tokens=32, stop_ids=[])
    assert got == want
    info = stats.drafter_info
    cannot_pay = info["modeled_draft_cost"] + info["verify_slope"] >= 1
    assert info["verify_slope"] == slope and cannot_pay == (head == 0.9)
    drafted = sum(r.n_drafted for r in stats.rounds)
    if cannot_pay:
        assert info["sits_out"].startswith(f"a draft of {info['draft_layers']} of 4 layers costs about 0.9")
        assert drafted == 0 and not proposals
        assert "drafting cannot pay here" in schedule_note(stats)
    else:
        assert "sits_out" not in info and drafted and proposals
    schedule.SLOPES[eng] = [(time.monotonic(), slope)]
    got, stats = speculative.generate(eng, drafter, ids, k=4, max_new_tokens=32, stop_ids=[], adaptive=False)
    assert got == want and all(r.n_drafted for r in stats.rounds[1:-1])


@pytest.mark.parametrize("weights, fused", [("fp32", False), ("fp32", True), ("q4", True)])
def test_a_short_prompts_calibration_is_the_targets_prefill(weights, fused):
    """A prompt of at most CONTEXT tokens is the calibration's whole forward: the target's cache then holds what
    Engine.prefill writes and the first logits are its logits, bit for bit, handed out once; a longer prompt's
    calibration (its last CONTEXT tokens) leaves the prefill to the target."""
    m = random_model(tiny_config(), weights=weights, fused=fused, seed=4)
    eng = Engine(m, 256)
    sampling = SamplingParams(0.0)
    for ids in (PROMPT, PROMPT * 4):  # 19 and 76 tokens, around CONTEXT = 64
        eng.begin(ids, 8, sampling)
        want = eng.prefill(ids)
        n = len(ids)
        want_k, want_v = eng.cache.k[:, :, :, :n].clone(), eng.cache.v[:, :, :, :n].clone()
        eng.cache.k.normal_(), eng.cache.v.normal_(), eng.cache.set_length(0)
        drafter = speculative.LayerSkipDrafter(eng)
        drafter.begin(eng, ids, sampling, 8)
        got = drafter.prefilled()
        if n > layerskip.CONTEXT:
            assert got is None and not drafter.describe()["calibration_prefilled"]
            continue
        assert drafter.describe()["calibration_prefilled"] and drafter.prefilled() is None  # once
        assert torch.equal(got, want) and eng.cache.length == n
        assert torch.equal(eng.cache.k[:, :, :, :n], want_k) and torch.equal(eng.cache.v[:, :, :, :n], want_v)
        assert eng.pick(got, sampling, None)[0] == int(want.argmax())


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_run_over_a_short_prompt_makes_one_prefill(model, monkeypatch, temperature):
    """The calibrated drafter's run over a short prompt calls the target's prefill never and decodes what plain
    decoding does; over a long prompt the target prefills once."""
    eng = Engine(model, 256)
    calls = Counter()
    prefill = eng.prefill
    monkeypatch.setattr(eng, "prefill", lambda *a, **k: calls.update([len(a[0])]) or prefill(*a, **k))
    for ids in (PROMPT, PROMPT * 4):
        want, _ = eng.generate(ids, 24, temperature=temperature, seed=7, stop_ids=[])
        calls.clear()
        got, stats = speculative.generate(eng, speculative.LayerSkipDrafter(eng), ids, k=3, max_new_tokens=24,
                                          temperature=temperature, seed=7, stop_ids=[])
        assert got == want
        assert calls == (Counter() if len(ids) <= layerskip.CONTEXT else Counter({len(ids): 1}))
        assert stats.drafter_info["calibration_prefilled"] == (len(ids) <= layerskip.CONTEXT)


@pytest.mark.parametrize("weights", ["fp32", "q4"])
def test_a_forward_with_tail_gives_its_last_rows_logits(weights):
    """forward(tail=n) runs the head on the last n positions alone (the calibration's window): the same logits as
    the whole forward's last n rows, bit for bit on the kernels, whose rows do not depend on the rows beside them."""
    from engine.kv_cache import KVCache

    m = random_model(tiny_config(), weights=weights, seed=6)
    m.ensure_rope(64)
    ids = torch.tensor([PROMPT * 2])
    out = {}
    with torch.inference_mode():
        for tail in (None, 5, 100):
            cache = KVCache(m.config, 1, 64, m.dtype, "cpu")
            cache.set_length(ids.shape[1])
            out[tail] = m(ids, cache, "prefill", tail=tail)
    assert out[5].shape == (1, 5, m.config.vocab_size) and torch.equal(out[100], out[None])
    if m.ops.head_greedy is not None:
        assert torch.equal(out[5], out[None][:, -5:])
    else:
        torch.testing.assert_close(out[5], out[None][:, -5:])


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("weights, fused", [("fp32", False), ("q4", True)])
def test_a_candidates_acceptance_is_the_chance_that_speculative_sampling_accepts(weights, fused, temperature):
    """Each candidate's acceptance is sum_x min(p_target, p_draft) averaged over the window, the one-hot
    distributions' at temperature 0 (which calibrate judges by the heads' argmaxes): the same float."""
    m = random_model(tiny_config(), weights=weights, fused=fused, seed=4)
    sampling, ids, window = SamplingParams(temperature), PROMPT * 2, layerskip.WINDOW
    cal = calibrate(m, ids, sampling)
    scores, logits, cache = influence(m, ids, window)
    p_target = probs(logits, sampling, m.ops.softmax)
    order = sorted(range(m.config.n_layers), key=scores.__getitem__)
    want = {}
    for n_skip in cal.candidates:
        p_draft = probs(drafted(m, sorted(order[n_skip:]), ids, window, cache), sampling, m.ops.softmax)
        want[n_skip] = torch.minimum(p_target, p_draft).sum(-1).mean().item()
    assert cal.candidates == want
    assert len(want) == 2 and min(want.values()) < 1  # a draft that disagrees somewhere
