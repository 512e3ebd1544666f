"""Speculative sampling is exact: the tokens come out distributed as plain sampling from the target, for every
drafter, at temperature 1 with top-p, at 0.7 with top-k and top-p and at 2 with both, with the real Schedule
choosing each round's k (up to 4) from the acceptance it sees, over 8 tokens: the first four against their exact
joint, the last four against the target's distribution given each run's own prefix.

The acceptance step keeps a draft where it equals the target's own sample drawn with the position's keyed noise
(engine/speculative/loop.py), so the checks on hand-built distributions also measure what that costs: one-hot
drafts are kept with probability p_t(x), as under the rejection rule, and coupled drafts at least as often as
the Gumbel coupling bound (1 - TV) / (1 + TV) promises.

Each check has a broken twin that must fail the same test, so the test is shown able to catch the bug it is
about: a verify pass that ignores the temperature or top-k, a bonus token drawn from the wrong row, noise keyed
by the round instead of the output position, and drafts kept past the first that differs. A drafter's own
distribution never enters the acceptance, so a drafter that samples from a wrong one costs acceptance, never
exactness: that is checked too, the other way round (it must pass)."""
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, load_model, speculative
from engine.ops import ref
from engine.sampling import Noise, SamplingParams, draw, probs, sample
from engine.speculative import drafters, loop
from engine.tiny import tiny_config, write_tiny_model
from schedules import Modeled

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.distribution]


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
    if len(obs) < 2:
        return 1.0  # one cell: nothing to test
    stat = ((obs - exp) ** 2 / exp).sum()
    return torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64), stat / 2).item()


# ---- broken twins --------------------------------------------------------------------------------------
def verify_ignores(**wrong):
    """The verify pass shaping p_target with some sampling setting dropped (temperature=1.0 or top_k=0)."""
    return lambda logits, sampling, noise, softmax=ref.softmax: sample(logits, replace(sampling, **wrong), noise,
                                                                       softmax)


def bonus_from_the_last_draft_row(logits, sampling, noise, softmax=ref.softmax):
    """Every draft judged right, but the token after them drawn from the last draft position's distribution
    instead of the row after it."""
    if sampling.greedy or logits.shape[0] < 2:
        return sample(logits, sampling, noise, softmax)
    p = probs(logits, sampling, softmax)
    return draw(torch.cat([p[:-1], p[-2:-1]]), noise), p


def noise_keyed_by_round(logits, sampling, noise, softmax=ref.softmax):
    """Every position of a verify pass drawn with the noise of the round's first position."""
    if sampling.greedy:
        return sample(logits, sampling, noise, softmax)
    p = probs(logits, sampling, softmax)
    e = noise.take(1, p.shape[-1]).expand_as(p)
    return (p / e).argmax(-1), p


def keeps_drafts_past_a_mismatch(draft, target):
    """Counts every draft that equals the target's sample, not only the run before the first that differs."""
    n = (draft == target[:-1]).long().sum()
    return n, target[n]


def raw_q(logits, sampling, noise, softmax=ref.softmax):
    """A drafter that draws from its unprocessed softmax (no temperature, top-k or top-p) and reports it."""
    dist = softmax(logits)
    return draw(dist, noise), dist


# ---- the acceptance step on hand-built distributions ---------------------------------------------------
def run_accept(accept_fn=speculative.accept, one_hot=False, shared=True, trials=6000):
    """Many rounds on fixed hand-built distributions (V=10, k=2), drafts drawn from p_d with the positions'
    keyed noise (shared=True, as the drafters do) or with other noise, or fixed one-hot drafts: counts of the
    first emitted token, of the second given the first draft kept, and of the bonus; the rate the first draft
    is kept."""
    g = torch.Generator().manual_seed(0)
    p_t = (2 * torch.randn(3, 10, generator=g)).softmax(-1)
    p_d = (2 * torch.randn(2, 10, generator=g)).softmax(-1)
    first, second, bonus, kept0 = torch.zeros(10), torch.zeros(10), torch.zeros(10), 0
    for seed in range(trials):
        noise = Noise(seed, "cpu")
        if one_hot:
            draft = torch.tensor([3, 1])
        else:
            draft = draw(p_d, noise if shared else Noise(seed + trials, "cpu"))
        target = draw(p_t, noise.at(0))
        n, nxt = (int(x) for x in accept_fn(draft, target))
        out = draft[:n].tolist() + [nxt]
        first[out[0]] += 1
        if n >= 1:
            kept0 += 1
            second[out[1]] += 1
        if n == 2:
            bonus[out[2]] += 1
    return p_t, p_d, first, second, bonus, kept0 / trials


def test_accept_output_has_the_target_distribution():
    """Coupled drafts: the output is the target's, and the first draft is kept at least as often as the
    Gumbel coupling bound says, at most as often as the rejection rule's 1 - TV (6000 trials: 3 standard errors
    are about 0.015)."""
    p_t, p_d, first, second, bonus, kept0 = run_accept()
    assert chi2_pvalue(first, p_t[0]) > 1e-3
    assert chi2_pvalue(second, p_t[1]) > 1e-3
    assert chi2_pvalue(bonus, p_t[2]) > 1e-3
    overlap = torch.minimum(p_t[0], p_d[0]).sum().item()  # 1 - TV
    tv = 1 - overlap
    assert (1 - tv) / (1 + tv) - 0.015 < kept0 < overlap + 0.015, (kept0, overlap)
    *_, uncoupled = run_accept(shared=False)  # independent draws are kept as often as sum p_t p_d
    assert abs(uncoupled - (p_t[0] * p_d[0]).sum().item()) < 0.015 and uncoupled < kept0 / 2


def test_one_hot_drafts_are_kept_with_the_target_probability():
    """A fixed draft x is kept with probability p_t(x), and the token emitted at its rejection is never x: the
    rejection rule for a one-hot draft."""
    p_t, _, first, second, _, kept0 = run_accept(one_hot=True)
    assert abs(kept0 - p_t[0, 3].item()) < 0.015
    assert chi2_pvalue(first, p_t[0]) > 1e-3 and chi2_pvalue(second, p_t[1]) > 1e-3


def test_keeping_drafts_past_a_mismatch_fails_the_same_check():
    p_t, _, first, second, _, _ = run_accept(keeps_drafts_past_a_mismatch, one_hot=True)
    assert min(chi2_pvalue(first, p_t[0]), chi2_pvalue(second, p_t[1])) < 1e-6


# ---- end to end: engine, drafter, verify pass, the real schedule ---------------------------------------
V = 8  # small enough that the exact joint of the first tokens is 8**4 cells and a few hundred forwards
PROMPT = [0, 2, 5, 5, 6, 2, 6, 5, 5, 6, 6, 4, 0, 3, 0, 2]  # repeats, so that n-gram drafts are often kept
# top-k 3 binds where the nucleus alone would keep more; at temperature 2 the distributions are flat, so a draft
# is often rejected and the resampled token carries much of the output
SAMPLINGS = {"t1-topp": SamplingParams(1.0, 0.8), "t07-topk-topp": SamplingParams(0.7, 0.95, 3),
             "t2-topk-topp": SamplingParams(2.0, 0.98, 6)}
N_RUNS, N_TOKENS, K = 1000, 8, 4


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A target over V tokens, and a draft model that is the target with a sharper head: its draws pile onto
    the target's likely tokens, so a verify pass that let them through unjudged would be biased toward them."""
    root = tmp_path_factory.mktemp("dist")
    cfg = tiny_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, bos_token_id=0, eos_token_id=V - 1)
    target = write_tiny_model(root / "target", cfg, seed=3, std=0.3)
    draft = write_tiny_model(root / "draft", cfg, seed=3, std=0.3)
    weights = load_file(draft / "model.safetensors")
    weights["lm_head.weight"] *= 2.5
    save_file(weights, draft / "model.safetensors")
    return load_model(target), load_model(draft), {}


def exact_joint(eng, prompt, sampling, depth):
    """p(first `depth` generated tokens): [V] * depth, from the target's logits, shaped as sampling does."""
    def dist(ids):
        return probs(eng.logits(prompt + ids)[-1:], sampling)[0].double()

    joint = dist([])
    for d in range(1, depth):
        nxt = torch.stack([dist(list(ix)) for ix in torch.cartesian_prod(*[torch.arange(V)] * d).view(-1, d).tolist()])
        joint = joint[..., None] * nxt.view(*[V] * d, V)
    return joint


def make_drafter(name, eng, draft_model):
    if name == "ngram":  # one-hot drafts
        return speculative.NgramDrafter()
    if name == "model":
        return speculative.ModelDrafter(Engine(draft_model, 32))
    if name == "itself":  # the target drafting for itself: every draft kept, so every round ends in a bonus
        return speculative.ModelDrafter(Engine(eng.model, 32))
    if name == "layer_skip":
        return speculative.LayerSkipDrafter(eng, n_layers=1)
    return speculative.self_drafter(eng, "int8")


def sampled_pvalues(small, monkeypatch, drafter, sampling_name, broken=None, runs=N_RUNS):
    """Chi-square p-values of the sampled runs (the real Schedule, k up to K, N_TOKENS tokens): the joints of
    consecutive pairs of the first 4 tokens against the exact joint; of the bonus (runs whose token 4 was a
    bonus: token 4 against p(token 4 | tokens 1-3)); and of each of tokens 5..8 against the target's
    distribution given the run's own prefix (expected counts summed over the runs). Also what the runs covered:
    rounds of k >= 3, bonus tokens, drafting rounds right after a fully accepted one (a model drafter's catch-up
    of the last draft and the bonus)."""
    target, draft_model, joints = small
    sampling = SAMPLINGS[sampling_name]
    patches = {"verify_temperature": (loop, "sample", verify_ignores(temperature=1.0)),
               "verify_top_k": (loop, "sample", verify_ignores(top_k=0)),
               "bonus_row": (loop, "sample", bonus_from_the_last_draft_row),
               "round_keyed": (loop, "sample", noise_keyed_by_round),
               "past_mismatch": (loop, "accept", keeps_drafts_past_a_mismatch),
               "raw_q": (drafters, "sample", raw_q)}
    monkeypatch.setattr(loop, "Schedule", Modeled)
    if broken:
        monkeypatch.setattr(*patches[broken])
    eng = Engine(target, max_seq_len=32)
    d = make_drafter(drafter, eng, draft_model)
    if sampling_name not in joints:
        joints[sampling_name] = exact_joint(eng, PROMPT, sampling, 4)
    joint = joints[sampling_name]
    counts, bonus = torch.zeros([V] * 4), torch.zeros([V] * 4)
    later_obs, later_exp = torch.zeros(N_TOKENS - 4, V), torch.zeros(N_TOKENS - 4, V)
    covered = dict(k2=0, k3=0, bonus=0, catch_up=0)
    for seed in range(runs):
        rounds = list(speculative.stream(eng, d, PROMPT, k=K, max_new_tokens=N_TOKENS,
                                         temperature=sampling.temperature, top_p=sampling.top_p,
                                         top_k=sampling.top_k, seed=seed, stop_ids=[]))
        emitted = [t for r in rounds for t in r.emitted]
        ids = [t.token_id for t in emitted]
        counts[tuple(ids[:4])] += 1
        if emitted[3].kind == "bonus":
            bonus[tuple(ids[:4])] += 1
        rows = probs(eng.logits(PROMPT + ids[:-1])[len(PROMPT) + 3:], sampling)  # tokens 5..8 given their prefix
        later_exp += rows
        later_obs[torch.arange(N_TOKENS - 4), torch.tensor(ids[4:])] += 1
        covered["k2"] += sum(r.n_drafted >= 2 for r in rounds)
        covered["k3"] += sum(r.n_drafted >= 3 for r in rounds)
        covered["bonus"] += sum(t.kind == "bonus" for t in emitted)
        covered["catch_up"] += sum(a.n_drafted and a.n_accepted == a.n_drafted and b.n_drafted > 0
                                   for a, b in zip(rounds[1:-1], rounds[2:], strict=True))
    summed_out = [(2, 3), (0, 3), (0, 1)]  # leaves the pairs (token 1, 2), (2, 3), (3, 4)
    pvalues = [chi2_pvalue(counts.sum(dims), joint.sum(dims)) for dims in summed_out]
    prefix = bonus.sum(-1, keepdim=True)  # runs per (t1, t2, t3) whose t4 was a bonus
    conditional = joint / joint.sum(-1, keepdim=True).clamp_min(1e-30)
    if prefix.sum() > 0:
        pvalues.append(chi2_pvalue(bonus, prefix * conditional / prefix.sum()))
    # tokens 5..8: each run's own conditional; Pearson's statistic on expected counts summed over runs whose
    # prefixes differ is conservative (a cell's variance is at most its expected count)
    pvalues += [chi2_pvalue(later_obs[j], later_exp[j] / runs) for j in range(N_TOKENS - 4)]
    return pvalues, covered


@pytest.mark.parametrize("drafter,sampling", [
    *[(d, s) for d in ("ngram", "model", "itself", "layer_skip", "self_draft") for s in ("t07-topk-topp",
                                                                                          "t2-topk-topp")],
    ("model", "t1-topp")])
def test_sampled_tokens_follow_the_target_distribution(small, monkeypatch, drafter, sampling):
    pvalues, covered = sampled_pvalues(small, monkeypatch, drafter, sampling)
    assert min(pvalues) > 1e-3, pvalues
    # the schedule drafted long, and some runs kept all. Layer-skip (1 of these 2 layers) keeps ~35% of its
    # drafts at T = 0.7, so the schedule seldom tries 3: about one round in 1,600 (300 runs), luck of the seeds;
    # rounds of 2 it drafts by the hundred
    long = "k2" if drafter == "layer_skip" else "k3"
    assert covered[long] > 0 and covered["bonus"] > 0, covered
    if drafter == "itself":
        assert covered["catch_up"] > N_RUNS, covered


def test_a_drafter_sampling_the_wrong_distribution_costs_acceptance_not_exactness(small, monkeypatch):
    pvalues, _ = sampled_pvalues(small, monkeypatch, "model", "t2-topk-topp", "raw_q")
    assert min(pvalues) > 1e-3, pvalues


@pytest.mark.parametrize("drafter,sampling,broken", [
    ("ngram", "t07-topk-topp", "verify_temperature"),
    ("model", "t07-topk-topp", "verify_temperature"),
    ("ngram", "t07-topk-topp", "verify_top_k"),
    ("model", "t07-topk-topp", "verify_top_k"),
    ("ngram", "t07-topk-topp", "bonus_row"),
    ("itself", "t07-topk-topp", "bonus_row"),
    ("itself", "t2-topk-topp", "round_keyed"),
    ("model", "t2-topk-topp", "round_keyed"),
    ("ngram", "t2-topk-topp", "past_mismatch"),
    ("layer_skip", "t2-topk-topp", "past_mismatch"),
])
def test_each_broken_twin_fails_the_same_check(small, monkeypatch, drafter, sampling, broken):
    pvalues, _ = sampled_pvalues(small, monkeypatch, drafter, sampling, broken)
    assert min(pvalues) < 1e-6, pvalues
