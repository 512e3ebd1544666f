"""The CPU kernel of a sampled pick under top-k / top-p (csrc/cpu/nucleus.h; engine/ops/cpu.py softmax routes to it):
the twin's mask (engine/ops/ref.py mask_logits) token for token and the kept tokens' softmax, on every
instruction-set path; and the row passes' batch invariance: a row's distribution and logsumexp have the same bits
alone, in a batch of rows and on any thread count, as a verify pass's rows must have a decode step's.

Tolerances: y = x / temperature is the twin's own float division, so both decide on the same values. The masses
are the terms e^(y - max), the kernel's exp against torch's (an ulp apart), summed in doubles in another order, so a
cut could move only where the mass before a token sits within ~1e-6 of top_p: the test skips such a row's mask
(near_cut; none of these rows has one). The kept probabilities are e^(y - max) / sum in doubles rounded once to
float: within 1.2e-7 relative (an ulp) of the twin's in doubles where they are above 1e-30 (below, a float rounds
them to 0 or a subnormal, both harmless beside a sum of 1)."""
from __future__ import annotations

import pytest
import torch

from cpu_paths import NAN
from engine.ops import ref
from engine.ops.cpu import CpuOps

SETTINGS = [(0, 0.9), (0, 0.5), (0, 0.05), (0, 0.999), (40, 1.0), (1, 1.0), (3, 0.9), (40, 0.8)]


def rows(V: int) -> torch.Tensor:
    """Logits at real scale, a flat row (a nucleus of most of the row: the search doubles past the first tokens),
    a row of few distinct values (ties at every cut), and a spike (one token 1000 above the rest: every other
    token is past the search's first floors)."""
    g = torch.Generator().manual_seed(V)
    real = torch.randn(3, V, generator=g) * 4
    flat = torch.randn(1, V, generator=g) * 0.05
    ties = torch.randint(0, 6, (2, V), generator=g).float()
    spike = torch.randn(1, V, generator=g)
    spike[0, V // 2] = 1000.0
    return torch.cat([real, flat, ties, spike])


def near_cut(y: torch.Tensor, top_k: int, top_p: float) -> bool:
    """Whether the mass before some token of row y (under the top-k mask) sits within 1e-6 of top_p."""
    if top_p >= 1:
        return False
    z = ref.mask_logits(y[None], top_k, 1.0)[0].double()
    p = z.softmax(-1)[z.sort(descending=True, stable=True).indices]
    return bool(((p.cumsum(-1) - p - top_p).abs() < 1e-6).any())


def assert_twins(out: torch.Tensor, x: torch.Tensor, temperature: float, top_k: int, top_p: float) -> None:
    y = x / temperature
    kept = torch.isfinite(ref.mask_logits(y, top_k, top_p))
    want = y.double().masked_fill(~kept, float("-inf")).softmax(-1)
    for r in range(x.shape[0]):
        if near_cut(y[r], top_k, top_p):
            continue
        assert (out[r][~kept[r]] == 0).all(), (r, temperature, top_k, top_p)
        big = want[r] > 1e-30
        rel = (out[r][big].double() - want[r][big]).abs() / want[r][big]
        assert (rel <= 1.2e-7).all(), (r, temperature, top_k, top_p, rel.max())
        assert (out[r][~big] <= 2e-30).all()


@pytest.mark.parametrize("V", [1, 5, 17, 300, 4099, 49152])
def test_nucleus_keeps_the_twins_tokens(m, V):
    x = rows(V)
    for temperature in (0.3, 0.7, 1.5):
        for top_k, top_p in SETTINGS:
            if top_k >= V and top_p == 1:
                continue  # no mask: the ops take softmax (below)
            out = torch.full(x.shape, NAN)
            assert m.nucleus(out, x, temperature, top_k, top_p)
            assert_twins(out, x, temperature, top_k, top_p)


def test_nucleus_ties_at_the_cut_keep_the_first_indices(m):
    """Ten tokens of equal logits take the whole mass: top-p 0.35 keeps the first four by index (the mass before the
    fourth is 0.3, before the fifth 0.4), wherever they sit; top-k 3 keeps all ten (the twin keeps every token at
    the k-th value)."""
    x = torch.full((1, 300), -1e4)
    at = torch.tensor([299, 3, 170, 8, 0, 22, 111, 5, 260, 14])
    x[0, at] = 0.0
    out = torch.full(x.shape, NAN)
    assert m.nucleus(out, x, 1.0, 0, 0.35)
    assert out[0].nonzero()[:, 0].tolist() == sorted(at.tolist())[:4]
    assert m.nucleus(out, x, 1.0, 3, 1.0)
    assert sorted(out[0].nonzero()[:, 0].tolist()) == sorted(at.tolist())
    torch.testing.assert_close(out[0, at], torch.full((10,), 0.1), rtol=1e-7, atol=0)


def test_a_rows_bits_are_the_same_alone_in_a_batch_and_on_any_threads(cpu_module):
    """Each row of 7 through softmax (temperature alone), logsumexp and the nucleus, against the row alone, on 1, 2,
    3 and 48 threads: the same bits. (A row's spans were once set by the thread count when it was alone: a row's
    softmax alone and in a batch of six came an ulp apart.)"""
    x = torch.randn(7, 49152, generator=torch.Generator().manual_seed(7)) * 4
    threads = torch.get_num_threads()

    def passes(x):
        soft, lse, nuc = torch.empty(x.shape), torch.empty(x.shape[0]), torch.empty(x.shape)
        cpu_module.softmax(soft, x, 0.7)
        cpu_module.logsumexp(lse, x)
        assert cpu_module.nucleus(nuc, x, 0.7, 40, 0.9)
        return soft, lse, nuc

    try:
        torch.set_num_threads(2)
        batch = passes(x)
        for n_threads in (1, 2, 3, 48):
            torch.set_num_threads(n_threads)
            assert all(torch.equal(a, b) for a, b in zip(passes(x), batch, strict=True)), n_threads
            for r in range(x.shape[0]):
                alone = passes(x[r:r + 1].clone())
                assert all(torch.equal(a[0], b[r]) for a, b in zip(alone, batch, strict=True)), (n_threads, r)
    finally:
        torch.set_num_threads(threads)


def test_a_row_holding_inf_or_nan_goes_to_the_twin(cpu_module):
    """The kernel says False for a row with NaN, +inf or -inf (the twin's answers there: NaN rows, a masked -inf),
    and the ops give the twin's result; top-k of V or more is no mask (the plain softmax kernel)."""
    ops = CpuOps(cpu_module)
    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(3))
    for r, bad in enumerate((NAN, float("inf"), -float("inf"))):
        y = x.clone()
        y[r, 17] = bad
        assert not cpu_module.nucleus(torch.empty(y.shape), y, 0.7, 0, 0.9)
        torch.testing.assert_close(ops.softmax(y, 0.7, 0, 0.9), ref.softmax(y, 0.7, 0, 0.9), equal_nan=True)
    torch.testing.assert_close(ops.softmax(x, 0.7, 500, 1.0), ref.softmax(x, 0.7), rtol=2e-6, atol=1e-9)
    got = ops.softmax(x, 0.7, 10, 0.8)
    assert_twins(got, x, 0.7, 10, 0.8)


def test_nucleus_rejects_bad_input(cpu_module):
    x = torch.zeros(3, 4)
    with pytest.raises(RuntimeError, match=r"x must be \[R, V\]"):
        cpu_module.nucleus(torch.empty(2, 3, 4), torch.zeros(2, 3, 4), 1.0, 0, 0.9)
    with pytest.raises(RuntimeError, match="out must have x's shape"):
        cpu_module.nucleus(torch.empty(3, 5), x, 1.0, 0, 0.9)
    for top_k in (0, 4, 9):
        with pytest.raises(RuntimeError, match="nothing to mask"):
            cpu_module.nucleus(torch.empty(3, 4), x, 1.0, top_k, 1.0)
    with pytest.raises(RuntimeError, match="top_k must be >= 0"):
        cpu_module.nucleus(torch.empty(3, 4), x, 1.0, -1, 0.9)
    for bad in (0.0, 1.5, NAN):
        with pytest.raises(RuntimeError, match=r"top_p must be in \(0, 1\]"):
            cpu_module.nucleus(torch.empty(3, 4), x, 1.0, 0, bad)
    for bad in (0.0, -1.0, NAN, float("inf"), 1e-300):
        with pytest.raises(RuntimeError, match="temperature must be a finite number > 0"):
            cpu_module.nucleus(torch.empty(3, 4), x, bad, 0, 0.9)
