"""Sampling: the masks, the shaping, and the draws: seeded, keyed by output position, distributed as asked."""
import math

import pytest
import torch

from engine.ops.ref import mask_logits
from engine.sampling import ROWS_KEPT, Noise, SamplingParams, argmax, position_key, probs, sample


def test_greedy_is_argmax_and_one_hot():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    params = SamplingParams(temperature=0)
    assert sample(logits, params, None)[0].tolist() == [1]
    assert probs(logits, params).tolist() == [[0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("x", [
    torch.tensor([[1.0, 3.0, 3.0, 2.0]]),  # ties: the first
    torch.tensor([[1.0, float("nan"), 5.0, float("nan")]]),  # a NaN is the maximum, the first of them
    torch.tensor([[float("-inf")] * 4, [0.0, -0.0, 0.0, 0.0]]),
    torch.tensor([[2.0, float("inf"), float("inf"), 1.0]]),
    torch.randn(5, 151936, generator=torch.Generator().manual_seed(0)),
    torch.randn(6, 40, generator=torch.Generator().manual_seed(1))[:, ::3],  # strided rows
    torch.randn(40, generator=torch.Generator().manual_seed(2)),  # one row, no batch dimension
    torch.randn(3, 50, generator=torch.Generator().manual_seed(3)).bfloat16(),  # torch's own path
])
def test_argmax_is_torchs(x):
    got, want = argmax(x), x.argmax(-1)
    assert got.dtype == want.dtype == torch.long and got.shape == want.shape and torch.equal(got, want)


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0]])
    kept = torch.isfinite(mask_logits(logits, top_k=2, top_p=1.0))
    assert kept.tolist() == [[False, True, False, True, False]]


def test_top_p_keeps_smallest_set_reaching_p():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = p.log()
    # 0.5 < 0.7 so the second token is needed; 0.5 + 0.3 >= 0.7 so the third is not
    assert torch.isfinite(mask_logits(logits, 0, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(mask_logits(logits, 0, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(mask_logits(logits, 0, 0.96)).tolist() == [[True, True, True, True]]
    # order in the vocabulary does not matter
    perm = torch.tensor([2, 0, 3, 1])
    assert torch.isfinite(mask_logits(logits[:, perm], 0, 0.7)).tolist() == [[False, True, False, True]]


def nucleus_rows(V: int) -> torch.Tensor:
    """Rows a nucleus is cut in: logits at real scale, a flat row (its nucleus past the first candidates, so the
    CPU's search grows), a row of few distinct values (ties at every cut), one with a top-k mask's -inf."""
    g = torch.Generator().manual_seed(V)
    real = torch.randn(3, V, generator=g) * 4
    flat = torch.randn(1, V, generator=g) * 0.05
    ties = torch.randint(0, 6, (2, V), generator=g).float()
    masked = torch.randn(1, V, generator=g) * 3
    masked[0, ::2] = float("-inf")
    return torch.cat([real, flat, ties, masked])


@pytest.mark.parametrize("V", [5, 300, 49152])
def test_top_p_on_the_cpu_is_the_sorted_rows_cut(monkeypatch, V):
    """The CPU looks for the nucleus among the top candidates (growing their number until the last falls outside
    it); a full stable sort of the row gives the same mask, ties at the cut kept by index, row by row and in a
    batch alike; and the kept set is the smallest prefix of the sorted row whose mass reaches top_p (in doubles,
    up to rows whose mass sits within 1e-5 of the cut)."""
    from engine.ops import ref, ref_sampling

    x = nucleus_rows(V)
    for top_p in (0.05, 0.5, 0.9, 0.95, 0.999):
        fast = ref.nucleus_drop(x, top_p)
        with monkeypatch.context() as m:
            m.setattr(ref_sampling, "NUCLEUS_CANDIDATES", V)
            assert torch.equal(ref.nucleus_drop(x, top_p), fast), top_p
        for r in range(x.shape[0]):
            assert torch.equal(ref.nucleus_drop(x[r:r + 1], top_p)[0], fast[r])
            order = x[r].sort(descending=True, stable=True).indices
            p = x[r].double().softmax(-1)[order]
            before = p.cumsum(-1) - p
            want = torch.zeros(V, dtype=torch.bool)
            want[order[before >= top_p]] = True
            near = ((before - top_p).abs() < 1e-5).any()
            assert near or torch.equal(fast[r], want), (top_p, r)
            assert (~fast[r]).sum() >= 1


def test_top_p_ties_at_the_cut_keep_the_first_indices():
    """Ten tokens of equal logits take the whole mass: top_p = 0.35 keeps the first four of them by index (mass
    before the fourth 0.3 < 0.35, before the fifth 0.4), wherever they sit."""
    logits = torch.full((1, 30), -1e4)
    at = torch.tensor([29, 3, 17, 8, 0, 22, 11, 5, 26, 14])
    logits[0, at] = 0.0
    kept = torch.isfinite(mask_logits(logits, 0, 0.35))[0]
    assert kept.nonzero()[:, 0].tolist() == sorted(at.tolist())[:4]


def test_a_row_holding_nan_samples_under_top_p_as_without_it():
    """The nucleus of a row holding NaN drops nothing (its masses are NaN), so the row samples as an unmasked one
    (a row of NaN probabilities, whose race takes index 0), instead of the mask failing on an empty nucleus."""
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(4))
    logits[0, [40, 7]] = float("nan")
    assert torch.isfinite(mask_logits(logits, 0, 0.9)[0]).sum() == 298
    picks = []
    for top_p in (0.9, 1.0):
        noise = SamplingParams(seed=3).generator("cpu")
        tok, dist = sample(logits, SamplingParams(temperature=0.7, top_p=top_p), noise)
        assert dist[0].isnan().all() and torch.isfinite(dist[1]).all()
        picks.append(tok[0].item())
    assert picks == [0, 0]


def test_probs_renormalise_after_masks():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    q = probs(logits, SamplingParams(temperature=0.7, top_k=10, top_p=0.9))
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    assert ((q > 0).sum(-1) <= 10).all()


def test_sampling_reproducible_per_seed_and_matches_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.5]])
    params = SamplingParams(temperature=1.0, seed=7)

    def draw(p):
        g = p.generator("cpu")
        return [sample(logits, p, g)[0].item() for _ in range(4000)]

    a, b = draw(params), draw(params)
    assert a == b
    assert a != draw(SamplingParams(temperature=1.0, seed=8))
    freq = torch.bincount(torch.tensor(a), minlength=4).float() / len(a)
    # 4000 draws: the standard error of each frequency is below 0.008, so 0.03 is a > 3.5 sigma bound
    torch.testing.assert_close(freq, logits.softmax(-1)[0], atol=0.03, rtol=0)


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
])
def test_bad_sampling_settings_name_the_value(kw, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kw)


# ---- draws keyed by output position ---------------------------------------------------------------------
def test_noise_rows_depend_on_seed_and_position_only():
    """Row i is the same whether it is drawn first or after others, alone or in a batch, ahead of the cursor or
    again after at(); another seed or another position gives another row."""
    V = 97
    a = Noise(5, "cpu")
    rows = a.take(4, V)  # positions 0..3 in one batch
    b = Noise(5, "cpu")
    b.at(2)
    torch.testing.assert_close(b.take(1, V)[0], rows[2], rtol=0, atol=0)
    torch.testing.assert_close(b.at(0).take(2, V), rows[:2], rtol=0, atol=0)
    assert not torch.equal(Noise(6, "cpu").take(1, V)[0], rows[0])
    assert not torch.equal(rows[0], rows[1])
    assert len({position_key(s, i) for s in range(50) for i in range(50)}) == 2500
    assert (rows > 0).all()


def test_noise_rows_are_exponential():
    """E = -log U with U uniform: mean 1, and P(E > 1) = 1/e. 200k values: both within 4 standard errors."""
    e = Noise(0, "cpu").take(8, 25_000).flatten()
    assert abs(e.mean().item() - 1) < 4 * 1 / len(e) ** 0.5
    p = (e > 1).float().mean().item()
    assert abs(p - math.exp(-1)) < 4 * (p * (1 - p) / len(e)) ** 0.5


def test_noise_draws_agree_across_kernel_and_twin():
    """The CPU kernel's rows (csrc/cpu/noise.h) and the twin's are the same uniforms under logs that agree to
    ~1 ulp, so a run's draws are the same tokens through either: 400 positions of a 5,000-token race."""
    from cpu_paths import load_module
    from engine.ops.cpu import CpuOps

    kernel = CpuOps(load_module()).exp_noise
    logits = torch.randn(1, 5000, generator=torch.Generator().manual_seed(2)) * 3
    params = SamplingParams(1.0, seed=11)
    a, b = params.generator("cpu"), params.generator("cpu", kernel)
    for position in range(400):
        assert torch.equal(sample(logits, params, a.at(position))[0], sample(logits, params, b.at(position))[0])


def test_noise_keeps_only_the_rows_ahead():
    """Plain decoding never moves the cursor back: the rows it keeps stay bounded whatever the run's length."""
    n = Noise(1, "cpu")
    for _ in range(3 * ROWS_KEPT):
        n.take(1, 11)
    assert len(n.rows) <= ROWS_KEPT
    n.at(5 * ROWS_KEPT)
    assert not n.rows


def test_a_draw_is_the_same_in_a_batch_or_alone():
    """sample() over R rows from position p draws each row as a one-row sample at its own position would: what
    makes a verify pass's samples plain decoding's."""
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=3)
    batch, _ = sample(logits, params, params.generator("cpu").at(7))
    alone = [sample(logits[i:i + 1], params, params.generator("cpu").at(7 + i))[0].item() for i in range(5)]
    assert batch.tolist() == alone
