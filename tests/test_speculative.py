"""Speculative decoding: the acceptance step on hand-built distributions, greedy output identical to plain
decoding for every drafter, sampled output distributed exactly as the target's, and events that agree with
the ids and the stats."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, load_model, speculative
from engine.drafters import Draft, Drafter
from engine.sampling import draw
from engine.sampling import SamplingParams, probs
from engine.tiny import tiny_config, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def chi2_pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probabilities p (same shape); cells expecting fewer than
    5 are pooled into one, so a count where p is 0 still lands somewhere the test sees it."""
    counts, expected = counts.flatten().double(), counts.sum() * p.flatten().double()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    if exp[-1] == 0:
        if obs[-1] > 0:
            return 0.0
        obs, exp = obs[:-1], exp[:-1]
    stat = ((obs - exp) ** 2 / exp).sum()
    return torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64), stat / 2).item()


def broken_accept(draft, p_target, p_draft=None, gen=None):
    """Resamples from p_target instead of the residual at a rejection: biased toward the draft."""
    k = draft.shape[0]
    pt = p_target[torch.arange(k), draft].double()
    pd = torch.ones_like(pt) if p_draft is None else p_draft[torch.arange(k), draft].double()
    n = (torch.rand(k, dtype=torch.float64, generator=gen) * pd < pt).long().cumprod(0).sum()
    return n, draw(p_target[n][None], gen)[0]


# ---- the acceptance step -----------------------------------------------------------------------------
def test_accept_greedy_one_hot_keeps_the_argmax_run():
    p_t = torch.nn.functional.one_hot(torch.tensor([2, 5, 7, 1]), 10).float()
    for draft, want in (([2, 5, 3], (2, 7)), ([2, 5, 7], (3, 1)), ([9, 5, 7], (0, 2))):
        for p_d in (None, torch.nn.functional.one_hot(torch.tensor(draft), 10).float()):
            n, nxt = speculative.accept(torch.tensor(draft), p_t, p_d, torch.Generator().manual_seed(0))
            assert (n.item(), nxt.item()) == want


def test_accept_edge_probabilities():
    g = torch.Generator().manual_seed(1)
    p = torch.rand(4, 10, generator=g).softmax(-1)
    draft = torch.tensor([3, 1, 4])
    for _ in range(50):
        assert speculative.accept(draft, p, p[:3], g)[0].item() == 3  # p_t == p_d: always kept
        zero = p.clone()
        zero[0, 3] = 0
        n, nxt = speculative.accept(draft, zero, p[:3], g)  # p_t(x) == 0: never kept, never resampled
        assert n.item() == 0 and nxt.item() != 3
        n, nxt = speculative.accept(draft, p, None, g)  # one-hot draft: the residual excludes the draft
        assert n.item() == 3 or nxt.item() != draft[n].item()


def run_accept(accept_fn, trials=6000):
    """Many rounds on fixed hand-built distributions (V=10, k=2): counts of the first emitted token, of
    the second given the first draft kept, and of the bonus."""
    g = torch.Generator().manual_seed(0)
    p_t = (2 * torch.randn(3, 10, generator=g)).softmax(-1)
    p_d = (2 * torch.randn(2, 10, generator=g)).softmax(-1)
    first, second, bonus, kept0 = torch.zeros(10), torch.zeros(10), torch.zeros(10), 0
    for _ in range(trials):
        draft = torch.multinomial(p_d, 1, generator=g)[:, 0]
        n, nxt = (int(x) for x in accept_fn(draft, p_t, p_d, g))
        out = draft[:n].tolist() + [nxt]
        first[out[0]] += 1
        if n >= 1:
            kept0 += 1
            second[out[1]] += 1
        if n == 2:
            bonus[out[2]] += 1
    return p_t, p_d, first, second, bonus, kept0 / trials


def test_accept_output_has_the_target_distribution():
    p_t, p_d, first, second, bonus, kept0 = run_accept(speculative.accept)
    assert chi2_pvalue(first, p_t[0]) > 1e-3
    assert chi2_pvalue(second, p_t[1]) > 1e-3
    assert chi2_pvalue(bonus, p_t[2]) > 1e-3
    assert abs(kept0 - torch.minimum(p_t[0], p_d[0]).sum().item()) < 0.03  # P(keep) = sum min(p_t, p_d)


def test_a_broken_residual_fails_the_same_check():
    p_t, _, first, second, _, _ = run_accept(broken_accept)
    assert chi2_pvalue(first, p_t[0]) < 1e-6 and chi2_pvalue(second, p_t[1]) < 1e-6


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
            "layer_skip": speculative.LayerSkipDrafter(target_eng, n_layers=2)}


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_matches_plain_for_every_drafter(tiny, k):
    eng = Engine(tiny[0], max_seq_len=256)
    want, _ = eng.generate(PROMPT, max_new_tokens=40, stop_ids=[])
    for name, drafter in drafters(eng, tiny[1]).items():
        got, stats = speculative.generate(eng, drafter, PROMPT, k=k, max_new_tokens=40, stop_ids=[])
        assert got == want, (name, k)
        if name == "self":  # the target drafting for itself agrees everywhere
            assert stats.summary()["acceptance_rate"] == 1.0


def test_greedy_ends_inside_an_accepted_run(tiny):
    """A stop id met inside the drafts ends the run there; so does max_new_tokens mid-round."""
    eng = Engine(tiny[0], max_seq_len=256)
    plain, _ = eng.generate(PROMPT, max_new_tokens=30, stop_ids=[])
    drafter = speculative.ModelDrafter(Engine(tiny[0], 256))
    for stop_at in (3, 6, 11):  # k=4: rounds emit 5, so these fall inside runs of accepted drafts
        stop = plain[stop_at]
        want = plain[: plain.index(stop) + 1]
        got, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=30, stop_ids=[stop])
        assert got == want and stats.rounds[-1].finished
    for n in range(1, 14):
        got, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=n, stop_ids=[])
        assert got == plain[:n] and [r.finished for r in stats.rounds].count(True) == 1


def test_prompts_shorter_than_the_ngram(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    for prompt in ([65], [65, 66]):
        want, _ = eng.generate(prompt, max_new_tokens=20, stop_ids=[])
        got, _ = speculative.generate(eng, speculative.NgramDrafter(max_n=3), prompt, k=3, max_new_tokens=20,
                                      stop_ids=[])
        assert got == want


class Never(Drafter):
    """Proposes a token the target never picks, so every draft is rejected."""

    def __init__(self, token):
        self.token = token

    def propose(self, k, sampling, gen):
        return Draft(torch.full((k,), self.token), None, None)


def test_a_draft_that_is_always_rejected(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    want, _ = eng.generate(PROMPT, max_new_tokens=25, stop_ids=[])
    never = next(t for t in range(tiny[0].config.vocab_size) if t not in want)
    got, stats = speculative.generate(eng, Never(never), PROMPT, k=3, max_new_tokens=25, stop_ids=[])
    assert got == want
    s = stats.summary()
    assert s["acceptance_rate"] == 0 and s["mean_accepted_len"] == 1
    assert all([t.kind for t in r.tokens] == ["rejected", "resampled"] for r in stats.rounds[1:])


def test_bad_k_and_drafter_sharing_the_target_engine(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    for k in (0, 17, 2.5):
        with pytest.raises(ValueError, match=f"k={k}"):
            speculative.generate(eng, speculative.NgramDrafter(), PROMPT, k=k)
    with pytest.raises(ValueError, match="its own Engine"):
        speculative.generate(eng, speculative.ModelDrafter(eng), PROMPT, k=2)
    with pytest.raises(ValueError, match="max_seq_len=256"):  # the draft slots count against the cache
        speculative.generate(eng, speculative.NgramDrafter(), PROMPT, k=8, max_new_tokens=256 - len(PROMPT))


# ---- events agree with the ids and the stats -----------------------------------------------------------
def test_events_agree_with_ids_and_stats(tiny):
    eng = Engine(tiny[0], max_seq_len=256)
    drafter = speculative.ModelDrafter(Engine(tiny[1], 256))
    ids, stats = speculative.generate(eng, drafter, PROMPT, k=4, max_new_tokens=60, temperature=1.0, seed=3)
    assert ids == stats.ids and len(ids) == 60
    rounds = stats.rounds
    assert rounds[0].tokens[0].kind == "target" and [r.index for r in rounds] == list(range(len(rounds)))
    assert [r.finished for r in rounds] == [False] * (len(rounds) - 1) + [True]
    for r in rounds[1:]:
        kinds = [t.kind for t in r.tokens]
        n = r.n_accepted
        assert kinds[:n] == ["accepted"] * n and [t.draft_position for t in r.tokens[:n]] == list(range(n))
        assert kinds[n:] in (["rejected", "resampled"], ["bonus"]) or (r.finished and kinds[n:] == [])
        drafts = [t for t in r.tokens if t.kind in ("accepted", "rejected")]
        assert all(0 < t.p_target <= 1 and 0 < t.p_draft <= 1 for t in drafts)
        if kinds[n:] == ["rejected", "resampled"]:
            assert r.tokens[n].draft_position == r.tokens[n + 1].draft_position == n
        assert r.n_drafted == 4 or r.finished
    s = stats.summary()
    spec = rounds[1:]
    assert s["acceptance_rate"] == sum(r.n_accepted for r in spec) / sum(r.n_drafted for r in spec)
    assert sum(stats.accepted_histogram().values()) == len(spec)
    assert s["tokens"] == 1 + sum(len(r.emitted) for r in spec)
    assert len(stats.rows()) == sum(len(r.tokens) for r in rounds)
    assert stats.settings["mode"] == "draft_model" and stats.settings["k"] == 4


# ---- sampling: the output is distributed as the target's -----------------------------------------------
V = 8  # small enough that the exact joint of the first tokens is 8**4 cells and a few hundred forwards
DIST_PROMPT = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5, 0, 7, 2, 6, 4, 3]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A target over V tokens, and a draft model that is the target with a sharper head: its p_d piles
    onto the target's likely tokens, so a residual that ignores p_d would be biased toward them."""
    root = tmp_path_factory.mktemp("dist")
    cfg = tiny_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=V - 1)
    target = write_tiny_model(root / "target", cfg, seed=3, std=0.3)
    draft = write_tiny_model(root / "draft", cfg, seed=3, std=0.3)
    weights = load_file(draft / "model.safetensors")
    weights["lm_head.weight"] *= 2.5
    save_file(weights, draft / "model.safetensors")
    return load_model(target), load_model(draft)


def exact_joint(eng, prompt, sampling, depth):
    """p(first `depth` generated tokens): [V] * depth, from the target's logits, shaped as sampling does."""
    def dist(ids):
        return probs(eng.logits(prompt + ids)[-1:], sampling)[0].double()

    joint = dist([])
    for d in range(1, depth):
        nxt = torch.stack([dist(list(ix)) for ix in torch.cartesian_prod(*[torch.arange(V)] * d).view(-1, d).tolist()])
        joint = joint[..., None] * nxt.view(*[V] * d, V)
    return joint


N_RUNS = 500


@pytest.mark.parametrize("drafter,temperature,top_p,broken", [
    ("model", 1.0, 1.0, False), ("model", 1.0, 0.8, False), ("ngram", 1.0, 1.0, False), ("ngram", 1.0, 0.8, False),
    ("model", 1.0, 1.0, True), ("ngram", 1.0, 1.0, True),
])
def test_sampled_tokens_follow_the_target_distribution(small, monkeypatch, drafter, temperature, top_p, broken):
    """Chi-square of the joint of consecutive pairs of the first 4 tokens (k=2: round 1 emits tokens 2-4,
    accepted, resampled or bonus) against the exact joint; the broken residual must fail it."""
    if broken:
        monkeypatch.setattr(speculative, "accept", broken_accept)
    eng = Engine(small[0], max_seq_len=32)
    d = speculative.ModelDrafter(Engine(small[1], 32)) if drafter == "model" else speculative.NgramDrafter()
    joint = exact_joint(eng, DIST_PROMPT, SamplingParams(temperature, top_p), 4)
    counts = torch.zeros([V] * 4)
    for seed in range(N_RUNS):
        ids = [t.token_id for r in speculative.stream(eng, d, DIST_PROMPT, k=2, max_new_tokens=4,
                                                        temperature=temperature, top_p=top_p, seed=seed,
                                                        stop_ids=[]) for t in r.emitted]
        counts[tuple(ids)] += 1
    summed_out = [(2, 3), (0, 3), (0, 1)]  # leaves the pairs (token 1, 2), (2, 3), (3, 4)
    pvalues = [chi2_pvalue(counts.sum(dims), joint.sum(dims)) for dims in summed_out]
    if broken:
        assert min(pvalues) < 1e-6, pvalues
    else:
        assert min(pvalues) > 1e-3, pvalues
