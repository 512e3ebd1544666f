"""The CPU kernels of a token's pick (engine/sampling.py): logsumexp (csrc/cpu/rowwise.h exp_span, the shown
probability exp(logit - logsumexp)) against torch.logsumexp and softmax (the same pass, the sampling distribution)
against torch's in doubles, on every instruction-set path, and the sampling noise
(csrc/cpu/noise.h) against its torch twin, ref.exp_noise. Their release of the GIL is checked with the other
bindings' in tests/test_kernels_cpu_ops.py."""
from __future__ import annotations

import pytest
import torch

from cpu_paths import NAN, randn
from engine.ops import ref
from engine.sampling import position_key


def assert_softmax(out, x, temperature):
    """out within (1e-6 + 5e-7 x |argument|) of softmax(x / temperature) in doubles, relative: the row's sum in
    fp32 stretches (~1e-6), and each value's argument c (x - max) as exp sees it (its rounding's error grows with
    it, torch's float softmax's as much); or within 2 FLT_MIN where the argument is past -87.3, which the kernel's
    exp clamps (terms of ~1e-38 that torch makes subnormal or 0, beside a row's sum of >= 1)."""
    y = x.double() / temperature
    arg = (y - y.amax(-1, keepdim=True)).abs().nan_to_num(posinf=0.0)  # a masked -inf: want and out both 0
    want = y.softmax(-1)
    err = (out.double() - want).abs()
    tol = (1e-6 + 5e-7 * arg) * want + 2 * torch.finfo(torch.float32).tiny
    assert (err <= tol).all(), (err / tol).max()
    torch.testing.assert_close(out.double().sum(-1), torch.ones(x.shape[0], dtype=torch.float64), rtol=0, atol=2e-6)


@pytest.mark.parametrize("V", [1, 17, 4097, 16400, 49152, 262144])
def test_softmax(m, V):
    """torch's softmax(x / temperature) per row: the row's max, then e^(c (x - max)) written and summed in the same
    pass (c = 1 / temperature), in spans of 8,192 values across the threads, each span then
    scaled by e^(c (its max - the row's)) / the row's sum. Logits at real scale and far past exp's range."""
    for rows in (1, 2, 9):
        for scale in (8.0, 300.0):
            for temperature in (0.7, 1.0, 1.9):
                x = randn(rows, V, seed=V + rows, scale=scale)
                out = torch.full((rows, V), NAN)
                m.softmax(out, x, temperature)
                assert_softmax(out, x, temperature)


def test_softmax_spans_on_many_threads(cpu_module):
    """One row of 3 spans (the last one shorter) over 3 and 48 threads, more threads than spans: the same values."""
    x = randn(1, 17000, seed=18, scale=5)
    threads = torch.get_num_threads()
    try:
        for n_threads in (3, 48):
            torch.set_num_threads(n_threads)
            out = torch.full((1, 17000), NAN)
            cpu_module.softmax(out, x, 0.8)
            assert_softmax(out, x, 0.8)
    finally:
        torch.set_num_threads(threads)


def special_rows(V):
    """8 rows of V logits holding NaN, inf and -inf: a NaN (rows 0, 4), a +inf (1; 5 with a -inf too), all -inf
    (2), -inf but for 30 values (3), every other value -inf (6), the second half -inf (7: with three spans, one of
    them all -inf and the row's max in another)."""
    x = randn(8, V, seed=V, scale=5)
    x[0, 5] = NAN
    x[1, V - 1] = float("inf")
    x[2] = -float("inf")
    x[3, : V - 30] = -float("inf")
    x[4, V // 2 + 3] = NAN
    x[5, 0], x[5, V - 1] = float("inf"), -float("inf")
    x[6, 1::2] = -float("inf")
    x[7, V // 2:] = -float("inf")
    return x


def test_softmax_inf_and_nan(m):
    """torch's answers where the row holds inf or NaN, in a span of its own or not: a row of NaN for a NaN, a
    +inf, or a row of -inf; a -inf among finite values (a top-k or top-p mask) gives exactly 0 there and leaves
    the rest a distribution over the finite values."""
    for V in (40, 20000):  # one span; three spans
        x = special_rows(V)
        want = (x / 0.7).softmax(-1)
        for r in range(8):
            for rows in (x, x[r:r + 1].clone()):  # all rows; this row alone
                out = torch.full(rows.shape, 0.0)
                m.softmax(out, rows, 0.7)
                got = out[r] if rows.shape[0] == 8 else out[0]
                if want[r].isnan().any():
                    assert r in (0, 1, 2, 4, 5) and got.isnan().all()
                else:
                    assert_softmax(got[None], x[r:r + 1], 0.7)
                    assert (got[x[r] == -float("inf")] == 0).all()


def test_softmax_rejects_bad_input(cpu_module):
    with pytest.raises(RuntimeError, match=r"x must be \[R, V\]"):
        cpu_module.softmax(torch.empty(2, 3, 4), torch.zeros(2, 3, 4), 1.0)
    with pytest.raises(RuntimeError, match=r"out must have x's shape"):
        cpu_module.softmax(torch.empty(3, 5), torch.zeros(3, 4), 1.0)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-300):
        with pytest.raises(RuntimeError, match="temperature must be a finite number > 0"):
            cpu_module.softmax(torch.empty(3, 4), torch.zeros(3, 4), bad)


def keys_of(R, seed):
    return [position_key(seed, i) for i in range(R)]


def kernel_rows(m, keys, V):
    """The CPU kernel's noise rows of the keys (what the race makes on the fly)."""
    rows = []
    for key in keys:
        row = torch.empty(V)
        m.exp_noise(row, key)
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("V", [1, 7, 8, 15, 17, 300, 4097, 16400, 49152, 262144])
def test_race_is_the_argmax_over_the_noise(cpu_module, V):
    """The index torch's argmax gives over weights / the kernel's noise rows of the keys, exactly (the race makes
    the same values on the fly, and skips a log only where the token cannot win), and the twin's (ref.race, over
    torch's log): sampling distributions at several temperatures, with top-k's zeros, one row (split in spans
    across the threads) or several."""
    for rows in (1, 2, 9):
        logits = randn(rows, V, seed=V + 3 * rows, scale=4)
        for temperature in (0.3, 1.0, 3.0):
            w = (logits / temperature).softmax(-1)
            if V > 10:
                w[:, ::3] = 0  # masked tokens
            keys = keys_of(rows, V + rows)
            out = torch.full((rows,), -1, dtype=torch.long)
            cpu_module.race(out, w, keys)
            assert torch.equal(out, (w / kernel_rows(cpu_module, keys, V)).argmax(-1))
            assert torch.equal(out, ref.race(w, keys))


def test_race_skips_only_what_cannot_win(cpu_module):
    """Weights set at the skipping bound's edge: token 0's quotient is 1 - 2^-14, every other
    w_i = (1 - u_i)(1 + d_i) for small d_i of either sign, so thousands of tokens sit just above or below the bound
    and those with u_i near 1 (a few a row) beat token 0. The index is still torch's argmax over the noise."""
    V, winners = 40000, set()
    for seed in range(6):
        key = position_key(seed, 7)
        e = kernel_rows(cpu_module, [key], V)[0]
        one_minus_u = -torch.expm1(-e.double())  # 1 - u_i
        d = (torch.rand(V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) - 0.5) * 2 ** -19
        w = (one_minus_u * (1 + d)).float()[None]
        w[0, 0] = e[0] * (1 - 2 ** -14)
        out = torch.zeros(1, dtype=torch.long)
        cpu_module.race(out, w, [key])
        want = (w / e).argmax(-1).item()
        assert out.item() == want
        winners.add(want)
    assert len(winners - {0}) >= 4  # the rows' answers are not token 0's


def test_race_ties_nan_inf_and_spans(cpu_module):
    """Ties go to the first index, within 8 lanes, across them and across spans (w_i = the noise value gives a
    quotient of exactly 1); a row of zeros gives 0; a NaN weight wins at its first index and an inf at its first
    (torch's argmax), wherever they sit; the same answers on 3 and 48 threads."""
    V, key = 20000, position_key(1, 1)
    e = kernel_rows(cpu_module, [key], V)[0]
    out = torch.zeros(1, dtype=torch.long)
    for where in ([5, 7], [300, 40, 19999], [15000, 10001], [19998, 19999]):
        w = torch.zeros(1, V)
        w[0, where] = e[where]
        cpu_module.race(out, w, [key])
        assert out.item() == min(where)
    cpu_module.race(out, torch.zeros(1, V), [key])
    assert out.item() == 0
    for bad, at in ((float("nan"), (0, 17, 9999, 10000, 19999)), (float("inf"), (3, 10002, 19990))):
        for i in at:
            w = torch.rand(1, V, generator=torch.Generator().manual_seed(i))
            w[0, i], w[0, min(i + 5, V - 1)] = bad, bad
            cpu_module.race(out, w, [key])
            assert out.item() == i == ref.race(w, [key]).item()
    threads = torch.get_num_threads()
    try:
        w = torch.rand(1, 17000, generator=torch.Generator().manual_seed(4))
        for n_threads in (3, 48):
            torch.set_num_threads(n_threads)
            cpu_module.race(out, w, [key])
            assert torch.equal(out, ref.race(w, [key]))
    finally:
        torch.set_num_threads(threads)


def test_race_rejects_bad_input(cpu_module):
    w = torch.rand(2, 30)
    with pytest.raises(RuntimeError, match="keys must be 2"):
        cpu_module.race(torch.empty(2, dtype=torch.long), w, [1])
    with pytest.raises(RuntimeError, match=r"keys\[1\] must be >= 0"):
        cpu_module.race(torch.empty(2, dtype=torch.long), w, [1, -3])
    with pytest.raises(RuntimeError, match="out must be"):
        cpu_module.race(torch.empty(2), w, [1, 2])


@pytest.mark.parametrize("V", [1, 17, 4097, 16400, 49152, 262144])
def test_logsumexp(m, V):
    """torch.logsumexp's value per row, within 2e-7 of the row's scale: a row's max, then e^(x - max) summed in
    4096-value stretches into a double, in spans of 8,192 values across the threads whatever the rows (one row: a
    greedy pick), and the spans' (max, sum) folded in order. Inputs at
    the scale of real logits (a spread of ~60) and far past exp's range."""
    for rows in (1, 2, 9):
        for scale in (8.0, 300.0):
            x = randn(rows, V, seed=V + rows, scale=scale)
            out = torch.full((rows,), NAN)
            m.logsumexp(out, x)
            want = torch.logsumexp(x.double(), -1).float()
            assert ((out - want).abs() <= 2e-7 * want.abs().clamp_min(1)).all(), (out - want).abs().max()


def test_logsumexp_spans_on_many_threads(cpu_module):
    """One row over 3 and 48 threads: a 17,000-value row makes 3 spans, fewer than the threads, the last one
    shorter, none empty or past the row's end."""
    x = randn(1, 17000, seed=17, scale=5)
    threads = torch.get_num_threads()
    try:
        for n_threads in (3, 48):
            torch.set_num_threads(n_threads)
            out = torch.full((1,), NAN)
            cpu_module.logsumexp(out, x)
            torch.testing.assert_close(out, torch.logsumexp(x.double(), -1).float(), rtol=2e-7, atol=0)
    finally:
        torch.set_num_threads(threads)


def test_logsumexp_inf_and_nan(m):
    """torch's answers wherever the row holds inf or NaN, in a span of its own or not: NaN for a NaN, +inf for
    a +inf, -inf for a row of -inf, and a -inf among finite values counts as e^-inf = 0 (a masked logit)."""
    for V in (40, 20000):  # one span; three spans
        x = special_rows(V)
        want = torch.logsumexp(x, -1)
        out = torch.full((8,), 0.0)
        m.logsumexp(out, x)
        torch.testing.assert_close(out, want, rtol=2e-7, atol=0, equal_nan=True)
        for r in range(8):  # each row alone
            one = torch.full((1,), 0.0)
            m.logsumexp(one, x[r:r + 1].clone())
            torch.testing.assert_close(one, want[r:r + 1], rtol=2e-7, atol=0, equal_nan=True)


def test_logsumexp_rejects_bad_shapes(cpu_module):
    with pytest.raises(RuntimeError, match=r"x must be \[R, V\]"):
        cpu_module.logsumexp(torch.empty(2), torch.zeros(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"out must be \[R\] = \[3\]"):
        cpu_module.logsumexp(torch.empty(2), torch.zeros(3, 4))


@pytest.mark.parametrize("V", [1, 7, 9, 1000, 16391, 49152])
def test_exp_noise_is_the_twins(cpu_module, V):
    """The CPU kernel's noise row is the twin's (ref.exp_noise: the same hashed uniforms, torch's log) within 2
    ulp, every value finite and > 0, the same whichever threads made which slice (rows of 16,384 values or
    more are split), and another key gives another row."""
    from engine.sampling import position_key

    for position in (0, 1, 500):
        key = position_key(7, position)
        out = torch.full((V,), NAN)
        cpu_module.exp_noise(out, key)
        want = ref.exp_noise(torch.empty(V), key)
        torch.testing.assert_close(out, want, rtol=2.4e-7, atol=0)
        assert torch.isfinite(out).all() and (out > 0).all()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            alone = torch.empty(V)
            cpu_module.exp_noise(alone, key)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(alone, out)
    other = torch.empty(V)
    cpu_module.exp_noise(other, position_key(8, 500))
    assert V < 9 or not torch.equal(other, out)


def test_exp_noise_rejects_bad_input(cpu_module):
    with pytest.raises(RuntimeError, match="out must be \\[V\\]"):
        cpu_module.exp_noise(torch.empty(2, 3), 1)
    with pytest.raises(RuntimeError, match="key must be >= 0"):
        cpu_module.exp_noise(torch.empty(3), -1)
