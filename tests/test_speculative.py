"""Speculative decoding: the acceptance step's edge cases, output identical to plain decoding's for every
drafter, greedy and sampled with the same seed, with the adaptive schedule, at fixed k and at random k, runs
that end inside a round, the cache they need, and events that agree with the ids and the stats. (The sampled
distribution: tests/test_spec_distribution.py; the schedule on its own: tests/test_schedule.py.)"""
import pytest
import torch

from engine import Engine, load_model, ops, speculative
from engine.sampling import SamplingParams, sample
from engine.speculative import loop
from engine.speculative.drafters import Draft, Drafter
from engine.ops import ext
from engine.tiny import tiny_config, tiny_cuda_config, write_tiny_model
from schedules import Modeled, RandomK

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the acceptance step -----------------------------------------------------------------------------
def test_accept_keeps_the_drafts_before_the_first_that_differs():
    target = torch.tensor([2, 5, 7, 1])  # the target's own samples at the three draft positions and after
    for draft, want in (([2, 5, 3], (2, 7)), ([2, 5, 7], (3, 1)), ([9, 5, 7], (0, 2)), ([2, 9, 7], (1, 5))):
        n, nxt = speculative.accept(torch.tensor(draft), target)
        assert (n.item(), nxt.item()) == want, draft  # [2, 9, 7]: the 7 matches, but after a rejection


def test_judge_never_keeps_what_the_target_cannot_sample():
    """A draft outside the target's top-k has p_target = 0: never kept, and the token the round emits there is
    the target's sample (never the rejected draft), for every seed."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 10, generator=g)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    outside = int(logits[0].argsort()[0])
    draft = Draft(torch.tensor([outside, 1, 2]), None, None)
    top3 = set(logits[0].topk(3).indices.tolist())
    for seed in range(50):
        tokens, n = loop.judge(draft, logits, sampling, SamplingParams(seed=seed).generator("cpu"), 0)
        assert n == 0 and [t.kind for t in tokens] == ["rejected", "resampled"]
        assert tokens[0].p_target == 0 and tokens[1].token_id in top3


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(0.8, top_k=6, top_p=0.9, seed=4)],
                         ids=["greedy", "sampled"])
def test_the_host_judge_is_the_device_judge(sampling):
    """judge on CPU float32 logits reads them on the host (judge_on_host); judge_on_device is the path every other
    case takes. Over drafts kept in full, in part and not at all, tied maxima (the first wins), and drafts with and
    without their own probabilities: the same tokens, kinds, positions and count, and the same probabilities
    (greedy: within float rounding, exp(logit - logsumexp) in doubles against fp32; sampled: the same floats)."""
    g = torch.Generator().manual_seed(5)
    kinds = set()
    for trial in range(300):
        k, V = 1 + trial % 6, 12
        logits = torch.randn(k + 1, V, generator=g) * (1 + trial % 3)
        if trial % 4 == 0:
            logits[:, 3] = logits[:, 9] = logits.max() + 1  # tied: 3 wins
        noise = SamplingParams(seed=trial).generator("cpu")
        # the target's own picks: the argmax, or its draws with this noise (the judge draws the same)
        best = logits.argmax(-1) if sampling.greedy else sample(logits, sampling, noise.at(0))[0]
        keep = int(torch.randint(0, k + 1, (1,), generator=g))  # drafts equal to the target's up to `keep`
        other = (best[:k] + 1 + torch.randint(0, V - 1, (k,), generator=g)) % V  # never the target's
        ids = torch.where(torch.arange(k) < keep, best[:k], other)
        probs = torch.rand(k, V, generator=g).softmax(-1) if trial % 2 else None
        p = torch.rand(k, generator=g) if trial % 3 else None
        draft = Draft(ids, probs, p)
        host, n_host = loop.judge(draft, logits, sampling, noise, 0)
        device, n_device = loop.judge_on_device(draft, logits, sampling, noise, 0)
        assert n_host == n_device == keep
        assert [(t.token_id, t.kind, t.draft_position) for t in host] == [
            (t.token_id, t.kind, t.draft_position) for t in device]
        for a, b in zip(host, device, strict=True):
            if sampling.greedy:
                assert a.p_target == pytest.approx(b.p_target, rel=1e-6, abs=1e-12)
            else:
                assert a.p_target == b.p_target
            assert (a.p_draft is None) == (b.p_draft is None)
            assert a.p_draft is None or a.p_draft == pytest.approx(b.p_draft, rel=1e-6)
        kinds |= {t.kind for t in host}
    assert kinds == {"accepted", "rejected", "resampled", "bonus"}


# ---- greedy: token for token the plain output ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    target = load_model(write_tiny_model(root / "target", tiny_config(), seed=1))
    other = load_model(write_tiny_model(root / "other", tiny_config(num_hidden_layers=2), seed=2))
    return target, other


PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 44, 32, 104, 101, 108, 108, 111, 32]


def drafters(target_eng, other):
    return {"ngram": speculative.NgramDrafter(max_n=3),
            "self": speculative.ModelDrafter(Engine(target_eng.model, 256)),
            "other": speculative.ModelDrafter(Engine(other, 256)),
            "layer_skip": speculative.LayerSkipDrafter(target_eng, n_layers=2),
            "layer_skip_set": speculative.LayerSkipDrafter(target_eng, layers=[0, 3]),
            "layer_skip_calibrated": speculative.LayerSkipDrafter(target_eng),
            "self_q4": speculative.self_drafter(target_eng, "q4"),
            "self_int8": speculative.self_drafter(target_eng, "int8")}


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_matches_plain_for_every_drafter(tiny, k):
    eng = Engine(tiny[0], max_seq_len=256)
    want, _ = eng.generate(PROMPT, max_new_tokens=40, stop_ids=[])
    for name, drafter in drafters(eng, tiny[1]).items():
        for adaptive in (False, True):
            got, stats = speculative.generate(eng, drafter, PROMPT, k=k, max_new_tokens=40, stop_ids=[],
                                              adaptive=adaptive)
            assert got == want, (name, k, adaptive)
            if name == "self" and not adaptive:  # the target drafting for itself agrees everywhere
                assert stats.summary()["acceptance_rate"] == 1.0


@pytest.mark.parametrize("sampling", [dict(temperature=0.8, top_k=20, top_p=0.95), dict(temperature=1.5)],
                         ids=["t0.8-topk-topp", "t1.5"])
def test_a_seed_gives_the_same_text_whatever_k(tiny, monkeypatch, sampling):
    """Draws keyed by output position: a sampled speculative run is the plain run with the same seed, token for
    token, for every drafter, at any fixed k, with the adaptive schedule and with k drawn at random."""
    eng = Engine(tiny[0], max_seq_len=256)
    for seed in (0, 1):
        want, _ = eng.generate(PROMPT, max_new_tokens=40, stop_ids=[], seed=seed, **sampling)
        assert want != eng.generate(PROMPT, max_new_tokens=40, stop_ids=[], seed=seed + 10, **sampling)[0]
        for name, drafter in drafters(eng, tiny[1]).items():
            for k, adaptive in ((1, False), (4, False), (8, True)):
                got, _ = speculative.generate(eng, drafter, PROMPT, k=k, max_new_tokens=40, stop_ids=[], seed=seed,
                                              adaptive=adaptive, **sampling)
                assert got == want, (name, k, adaptive, seed)
    with monkeypatch.context() as m:
        m.setattr(loop, "Schedule", RandomK)
        for name, drafter in drafters(eng, tiny[1]).items():
            got, stats = speculative.generate(eng, drafter, PROMPT, k=6, max_new_tokens=40, stop_ids=[], seed=1,
                                              **sampling)
            assert got == want and len({k for _, k in stats.chosen_k()}) > 3, name


class Scripted(Drafter):
    """Proposes the plain greedy continuation with the draft at `wrong` replaced by a token the target never
    picks there: the verify pass accepts `wrong` drafts, then rejects one."""

    def __init__(self, plain, wrong, bad_token):
        self.plain, self.wrong, self.bad = plain, wrong, bad_token

    def begin(self, target, prompt_ids, sampling, extra):
        self.n = 0

    def commit(self, n_accepted, emitted):
        self.n += len(emitted)

    def propose(self, k, sampling, noise):
        ids = self.plain[self.n:self.n + k]
        ids = ids[:self.wrong] + [self.bad] + ids[self.wrong + 1:]
        return Draft(torch.tensor(ids[:k]), None, None)


def test_greedy_ends_inside_an_accepted_run(tiny):
    """A stop id met inside the drafts ends the run there; so does max_new_tokens mid-round."""
    eng = Engine(tiny[0], max_seq_len=256)
    plain, _ = eng.generate(PROMPT, max_new_tokens=30, stop_ids=[])
    drafter = speculative.ModelDrafter(Engine(tiny[0], 256))
    for stop_at in (3, 6, 11):  # k=4: rounds emit 5, so these fall inside runs of accepted drafts
        stop = plain[stop_at]
        want = plain[: plain.index(stop) + 1]
        got, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=30, stop_ids=[stop],
                                          adaptive=False)
        assert got == want and stats.rounds[-1].finished
    for n in range(1, 14):
        got, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=n, stop_ids=[], adaptive=False)
        assert got == plain[:n] and [r.finished for r in stats.rounds].count(True) == 1


def test_a_round_cut_short_keeps_the_verify_passes_acceptance(tiny):
    """Round 1 drafts 4 and the target accepts 2, rejecting the third; the stop id is the first accepted draft.
    The output stops there, but the acceptance stats are the verify pass's: 2 of 4 drafted, position 2
    rejected (not 1 of 1, which would count the rejected draft as accepted)."""
    eng = Engine(tiny[0], max_seq_len=256)
    plain, _ = eng.generate(PROMPT, max_new_tokens=10, stop_ids=[])
    bad = next(t for t in range(tiny[0].config.vocab_size) if t not in plain)
    ids, stats = speculative.generate(eng, Scripted(plain, 2, bad), PROMPT, k=4, adaptive=False,
                                      max_new_tokens=10, stop_ids=[plain[1]])
    assert ids == plain[:2]
    rnd = stats.rounds[1]
    assert [t.kind for t in rnd.tokens] == ["accepted"] and rnd.finished
    assert (rnd.n_drafted, rnd.n_accepted) == (4, 2)
    assert stats.summary()["acceptance_rate"] == 0.5
    assert stats.per_position_acceptance() == [1.0, 1.0, 0.0]
    assert stats.accepted_histogram() == {2: 1}


def test_the_budget_never_cuts_a_round(tiny):
    """A round drafts at most the tokens left less one (its last token comes free), so max_new_tokens ends a run
    at a round's end, never inside its drafts."""
    eng = Engine(tiny[0], max_seq_len=256)
    plain, _ = eng.generate(PROMPT, max_new_tokens=12, stop_ids=[])
    drafter = speculative.ModelDrafter(Engine(tiny[0], 256))
    for n in range(1, 12):
        ids, stats = speculative.generate(eng, drafter, PROMPT, k=8, max_new_tokens=n, stop_ids=[], adaptive=False)
        assert ids == plain[:n]
        assert all(r.verified is None and r.k <= n - 1 for r in stats.rounds[1:])
        assert [t.kind for t in stats.rounds[-1].tokens][-1] in ("bonus", "resampled", "target")


def test_prompts_shorter_than_the_ngram(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    for prompt in ([65], [65, 66]):
        want, _ = eng.generate(prompt, max_new_tokens=20, stop_ids=[])
        for adaptive in (False, True):
            got, _ = speculative.generate(eng, speculative.NgramDrafter(max_n=3), prompt, k=3, max_new_tokens=20,
                                          stop_ids=[], adaptive=adaptive)
            assert got == want


class Never(Drafter):
    """Proposes a token the target never picks, so every draft is rejected."""

    def __init__(self, token):
        self.token = token

    def propose(self, k, sampling, noise):
        return Draft(torch.full((k,), self.token), None, None)


def test_a_draft_that_is_always_rejected(tiny, monkeypatch):
    """At fixed k every round drafts and loses; the schedule (on modeled round times: this is about what it
    learns from the acceptance) stops drafting after a few probes of one draft."""
    eng = Engine(tiny[0], max_seq_len=256)
    want, _ = eng.generate(PROMPT, max_new_tokens=40, stop_ids=[])
    never = next(t for t in range(tiny[0].config.vocab_size) if t not in want)
    got, stats = speculative.generate(eng, Never(never), PROMPT, k=3, max_new_tokens=40, stop_ids=[],
                                      adaptive=False)
    assert got == want
    s = stats.summary()
    assert s["acceptance_rate"] == 0 and s["mean_accepted_len"] == 1
    assert all([t.kind for t in r.tokens] == ["rejected", "resampled"] for r in stats.rounds[1:-1])
    assert stats.rounds[-1].k == 0  # one token left: a plain step
    monkeypatch.setattr(loop, "Schedule", Modeled)
    got, stats = speculative.generate(eng, Never(never), PROMPT, k=3, max_new_tokens=40, stop_ids=[])
    assert got == want
    ks = [k for _, k in stats.chosen_k()]
    # probes of one draft (with nothing ever accepted a longer draft never pays) while the optimistic bound on a
    # draft's acceptance clears the bar a probe must: a one-draft round at the modeled 1.07 steps beating a plain
    # step by MIN_GAIN needs a >= 1.05 * 1.07 - 1 = 0.12, and Beta(1, 1 + n)'s mean + sd falls under that at
    # n = 14 rejections (decay adds a round or two). Then a probe only when decay has worn the counts down.
    assert set(ks) <= {0, 1} and sum(ks[:20]) <= 16 and sum(ks[20:]) <= 3, ks


def test_bad_k_and_drafter_sharing_the_target_engine(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    for k in (0, 17, 2.5):
        with pytest.raises(ValueError, match=f"k={k}"):
            speculative.generate(eng, speculative.NgramDrafter(), PROMPT, k=k)
    with pytest.raises(ValueError, match="its own Engine"):
        speculative.generate(eng, speculative.ModelDrafter(eng), PROMPT, k=2)


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_run_needs_no_cache_slots_beyond_plain_decodings(tiny, adaptive):
    """k never exceeds the tokens left less one, so the target's cache never holds more than plain decoding's
    prompt + max_new_tokens - 1 positions: a run that exactly fills plain decoding's reservation works at
    k=8 for every drafter (a write past the cache would fail), one slot more is refused."""
    S = 64
    eng = Engine(tiny[0], max_seq_len=S)
    n = S - len(PROMPT)
    want, _ = eng.generate(PROMPT, max_new_tokens=n, stop_ids=[])
    for name, drafter in {"ngram": speculative.NgramDrafter(), "self": speculative.ModelDrafter(Engine(tiny[0], S)),
                          "layer_skip": speculative.LayerSkipDrafter(eng, n_layers=2)}.items():
        got, _ = speculative.generate(eng, drafter, PROMPT, k=8, max_new_tokens=n, stop_ids=[], adaptive=adaptive)
        assert got == want, name
        with pytest.raises(ValueError, match=f"max_seq_len={S}"):
            speculative.generate(eng, drafter, PROMPT, k=8, max_new_tokens=n + 1, adaptive=adaptive)


# ---- events agree with the ids and the stats -----------------------------------------------------------
def test_events_agree_with_ids_and_stats(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    drafter = speculative.ModelDrafter(Engine(tiny[1], 256))
    ids, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=60, temperature=1.0, seed=3,
                                      adaptive=False, stop_ids=[])
    assert ids == stats.ids and len(ids) == 60
    rounds = stats.rounds
    assert rounds[0].tokens[0].kind == "target" and [r.index for r in rounds] == list(range(len(rounds)))
    assert [r.finished for r in rounds] == [False] * (len(rounds) - 1) + [True]
    assert rounds[0].k is None and rounds[0].draft_info == drafter.describe()
    for r in rounds[1:]:
        kinds = [t.kind for t in r.tokens]
        n = r.n_accepted
        assert kinds[:n] == ["accepted"] * n and [t.draft_position for t in r.tokens[:n]] == list(range(n))
        assert kinds[n:] in (["rejected", "resampled"], ["bonus"]) or (r.finished and kinds[n:] == [])
        drafts = [t for t in r.tokens if t.kind in ("accepted", "rejected")]
        assert all(0 < t.p_target <= 1 and 0 < t.p_draft <= 1 for t in drafts)
        if kinds[n:] == ["rejected", "resampled"]:
            assert r.tokens[n].draft_position == r.tokens[n + 1].draft_position == n
        assert r.k == r.n_drafted == min(4, 60 - len([t for q in rounds[:r.index] for t in q.emitted]) - 1)
    s = stats.summary()
    spec = rounds[1:]
    assert s["acceptance_rate"] == sum(r.n_accepted for r in spec) / sum(r.n_drafted for r in spec)
    assert sum(stats.accepted_histogram().values()) == len(spec)
    assert s["tokens"] == 1 + sum(len(r.emitted) for r in spec)
    assert len(stats.rows()) == sum(len(r.tokens) for r in rounds)
    assert {row["round_k"] for row in stats.rows()} == {None} | {r.k for r in spec}
    assert stats.settings["mode"] == "draft_model" and stats.settings["k"] == 4
    assert s["mean_k"] == sum(r.k for r in spec) / len(spec) and s["plain_round_pct"] == 0


def test_adaptive_rounds_record_their_k(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    ids, stats = speculative.generate(eng, speculative.NgramDrafter(), PROMPT * 2, k=6, max_new_tokens=48,
                                      stop_ids=[])
    ks = stats.chosen_k()
    assert [i for i, _ in ks] == list(range(1, len(stats.rounds)))
    assert all(0 <= k <= 6 for _, k in ks)
    assert all(r.n_drafted <= r.k for r in stats.rounds[1:])
    assert stats.summary()["plain_round_pct"] == 100 * sum(k == 0 for _, k in ks) / len(ks)


# ---- bf16: what "greedy output is unchanged" means there -----------------------------------------------
# The CUDA case's model: head_dim 64, which the fused decode attention is built for (tiny_config's 16 runs the
# twins, so the kernels' bf16 rounding would go untested)
CUDA_CONFIG = tiny_cuda_config()


def test_the_cuda_case_runs_a_head_dim_the_kernels_take(monkeypatch):
    monkeypatch.setattr(ext, "load", lambda target: ext.ExtStatus(None, "not built in this test"))
    assert ops.select("cuda", head_dim=CUDA_CONFIG.head_dim).reason == "not built in this test"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_greedy_parts_from_plain_only_at_a_near_tie(tmp_path):
    """In bf16 a verify pass (T = k + 1 rows) and a decode step (one row) sum in different orders and round
    differently, so greedy speculative output is not guaranteed token for token. What holds: it equals plain
    up to the first token where they part, and there the two candidates' logits (prefill path, read in fp32)
    are within bf16's rounding of each other: a near-tie, not a bug."""
    model = load_model(write_tiny_model(tmp_path / "m", CUDA_CONFIG, seed=1), device="cuda", dtype="bfloat16")
    assert model.ops.name == "fused", model.ops.reason
    eng = Engine(model, 256)
    want, _ = eng.generate(PROMPT, max_new_tokens=48, stop_ids=[])
    for drafter in (speculative.NgramDrafter(), speculative.ModelDrafter(Engine(model, 256)),
                    speculative.LayerSkipDrafter(eng, n_layers=2)):
        for k in (1, 4):
            got, _ = speculative.generate(eng, drafter, PROMPT, k=k, max_new_tokens=48, stop_ids=[], adaptive=False)
            parted = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
            if parted is None:
                continue
            logits = eng.logits(PROMPT + want[:parted])[-1].float()
            gap = (logits[want[parted]] - logits[got[parted]]).abs().item()
            assert gap <= 4 * 2 ** -8 * logits.abs().max().item(), (drafter.name, k, parted, gap)
