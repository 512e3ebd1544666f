"""The quantized formats' activations in the CPU GEMMs (csrc/cpu/q16.h, kquants.h, legacy.h), on every
instruction-set path this CPU has (tests/cpu_paths.py): the 16-bit activations of q4 / q8 and the Q8_K ones of the
K-quants err by at most half a step against the fp32 matmul of the same weights; on inputs where nothing rounds,
every path gives the twin's integer sums exactly; and a block holding inf, NaN or denormals is defined and alike
on every path. The GEMMs against their twins, with the tolerances derived: tests/test_kernels_cpu.py."""
from __future__ import annotations

import pytest
import torch

from cpu_paths import K_QUANTS, NAN, assert_within, each_path, linear, randn
from engine import weights as W
from engine.ops import ref


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_16_bit_activations_err_by_half_a_step(cpu_module, fmt):
    """q4 and q8 against the fp32 matmul of the same (dequantized) weights: the 16-bit activations err by at
    most half a quantization step per input, dx / 2 with dx = amax / 32767 of each block, so
    |out - x @ w^T| <= sum_b (dx_b / 2) sum_{i in b} |w_i| plus fp32 rounding (1e-5 sum |w x|)."""
    w = randn(300, 576, seed=11)
    x = randn(3, 576, seed=12)
    x[0, 40] = 300.0  # an outlier channel: its block's step is large
    b = W.quantize(w, fmt)
    out = torch.empty(3, 300)
    linear(cpu_module, fmt, out, x, *W.to_panels(b))
    w_fp32 = W.dequantize(b)
    _, dx = ref.quantize_blocks(x, 576, 32767)
    step = (dx / 2).repeat_interleave(32, dim=1)  # [3, 576]: each input's half step
    assert_within(out, x @ w_fp32.t(), step @ w_fp32.abs().t() + 1e-5 * (x.abs() @ w_fp32.abs().t()),
                  f"{fmt} vs the fp32 matmul")


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_q16_exact_sums(cpu_module, fmt):
    """Inputs where nothing rounds: d = 1 (and m = -8), integer x with a block's largest |x| = 32767, so dx = 1,
    x16 = x and every fold term and partial sum is an integer below 2^24. Every path must then give the twin's
    output exactly: an off-by-one in any block's integer sum shows."""
    g = torch.Generator().manual_seed(3)
    out_f, n_in = 37, 96 if fmt == "q8" else 576
    nb = n_in // 32
    if fmt == "q4":
        b = W.Blocks("q4", out_f, n_in, torch.randint(0, 16, (out_f, n_in), generator=g, dtype=torch.uint8),
                     torch.ones(out_f, nb, dtype=torch.float16), torch.full((out_f, nb), -8.0, dtype=torch.float16))
    else:
        b = W.Blocks("q8", out_f, n_in, torch.randint(-127, 128, (out_f, n_in), generator=g, dtype=torch.int8),
                     torch.ones(out_f, nb, dtype=torch.float16))
    x = torch.randint(-100, 101, (17, n_in), generator=g).float()
    x[:, ::32] = 32767 * torch.where(torch.rand(17, nb, generator=g) < 0.5, -1.0, 1.0)  # each block's amax
    want = ref.linear_a16(x, *b.tensors)
    for name, mod in each_path(cpu_module):
        for T in (1, 2, 7, 16, 17):
            out = torch.full((T, out_f), NAN)
            linear(mod, fmt, out, x[:T].contiguous(), *W.to_panels(b))
            assert torch.equal(out, want[:T]), (name, T, (out - want[:T]).abs().max())


def test_q4_a8_exact_sums(cpu_module):
    """q4_a8 where nothing rounds: d = 1, m = -8, integer x with a block's largest |x| = 127, so dx = 1, qx = x and
    every fold term is an integer below 2^24. Every path must give the twin's output exactly: a nibble paired
    with the wrong input, a lost high nibble or a wrong min term shows."""
    g = torch.Generator().manual_seed(5)
    out_f, n_in = 37, 576
    nb = n_in // 32
    b = W.Blocks("q4_a8", out_f, n_in, torch.randint(0, 16, (out_f, n_in), generator=g, dtype=torch.uint8),
                 torch.ones(out_f, nb, dtype=torch.float16), torch.full((out_f, nb), -8.0, dtype=torch.float16))
    x = torch.randint(-100, 101, (17, n_in), generator=g).float()
    x[:, ::32] = 127 * torch.where(torch.rand(17, nb, generator=g) < 0.5, -1.0, 1.0)  # each block's amax
    want = ref.linear_a8(x, *b.tensors)
    assert torch.equal(want, x @ W.dequantize(b).t())  # exact: the recipe loses nothing here
    for name, mod in each_path(cpu_module):
        for T in (1, 2, 5, 7, 16, 17):
            out = torch.full((T, out_f), NAN)
            linear(mod, "q4_a8", out, x[:T].contiguous(), *W.to_panels(b))
            assert torch.equal(out, want[:T]), (name, T, (out - want[:T]).abs().max())


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_q8_k_activations_err_by_half_a_step(cpu_module, fmt):
    """The K-quants against the fp32 matmul of the same (dequantized) weights: the 8-bit activations err by at
    most half a step per input, dx / 2 with dx = amax / 127 of each super-block of 256, plus fp32 rounding."""
    w = randn(300, 576, seed=11)
    x = randn(3, 576, seed=12)
    x[0, 40] = 300.0  # an outlier channel: its super-block's step is large
    b = W.quantize(w, fmt)
    out = torch.empty(3, 300)
    linear(cpu_module, fmt, out, x, *W.to_panels(b))
    w_fp32 = W.dequantize(b)
    _, dx = ref.quantize_blocks(x, 768, 127, 256)
    step = (dx / 2).repeat_interleave(256, dim=1)[:, :576]
    assert_within(out, x @ w_fp32.t(), step @ w_fp32.abs().t() + 1e-5 * (x.abs() @ w_fp32.abs().t()),
                  f"{fmt} vs the fp32 matmul")


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_k_quant_exact_sums(cpu_module, fmt):
    """Inputs where nothing rounds: d = dmin = 1 and integer x with a super-block's largest |x| = 127, so dx = 1,
    qx = x, and every fold term and partial sum is an integer below 2^24 (small sub-block scales). Every path
    must give the twin's output exactly: an input, a scale or a min read from the wrong byte shows."""
    g = torch.Generator().manual_seed(3)
    out_f, n_in = 37, 768
    b = W.quantize(randn(out_f, n_in, seed=4), fmt)
    b.d = torch.ones_like(b.d)
    b.sc = torch.randint(-3 if fmt == "q6_k" else 0, 4, b.sc.shape, generator=g).to(b.sc.dtype)
    if b.m is not None:
        b.m = torch.ones_like(b.m)
        b.mn = torch.randint(0, 16 if fmt == "q2_k" else 64, b.mn.shape, generator=g).to(b.mn.dtype)  # 4 or 6 bits
    x = torch.randint(-100, 101, (17, n_in), generator=g).float()
    x[:, ::256] = 127 * torch.where(torch.rand(17, n_in // 256, generator=g) < 0.5, -1.0, 1.0)
    want = ref.linear_q8_k(x, b.q, b.d, b.sc, b.m, b.mn)
    assert want.abs().max() < 2**24
    for name, mod in each_path(cpu_module):
        for T in (1, 2, 7, 16, 17):
            out = torch.full((T, out_f), NAN)
            linear(mod, fmt, out, x[:T].contiguous(), *W.to_panels(b))
            assert torch.equal(out, want[:T]), (name, T, (out - want[:T]).abs().max())


@pytest.mark.parametrize("fmt", ["int8", "q4", "q4_a8", "q8", "q4_k", "q6_k"])
def test_activation_blocks_with_inf_nan_and_denormals(cpu_module, fmt):
    """The quantized formats' activation blocks, defined for every input (csrc/cpu/q16.h block_scales) and alike
    on every path: a block holding inf or NaN makes its row's outputs NaN, as a float matmul's would be inf or
    NaN; a block of denormals, or of values too small to scale (amax below qmax / FLT_MAX), counts as zeros;
    denormals beside normal values quantize to 0 like any value below half a step. The twin does the same."""
    tiny = 1e-35 if fmt in ("q4", "q8") else 1e-37  # below 32767 / FLT_MAX, and below 127 / FLT_MAX = 3.7e-37
    x = randn(7, 96, seed=31)
    x[0, 5] = float("inf")
    x[1, 40] = float("nan")
    x[2, 70] = -float("inf")
    x[3, 32:64] = 1e-40  # denormals only
    x[4, 32:64] = tiny
    x[5, 64:66] = 1e-41  # denormals beside normal values
    zeroed = x[3:5].clone()
    zeroed[:, 32:64] = 0
    b = W.quantize(randn(40, 96, seed=32), fmt)
    acts = W.get(fmt).cpu_activations
    want = (ref.linear_a8(x, *b.tensors) if acts == "int8" else ref.linear_a16(x, *b.tensors) if acts == "int16"
            else ref.linear_q8_k(x, b.q, b.d, b.sc, b.m, b.mn))
    assert want[:3].isnan().all() and not want[3:].isnan().any()
    first = None
    for name, mod in each_path(cpu_module):
        out = torch.full((7, 40), NAN)
        linear(mod, fmt, out, x, *W.to_panels(b))
        assert out[:3].isnan().all() and not out[3:].isnan().any(), name
        torch.testing.assert_close(out[3:], want[3:], rtol=1e-5, atol=1e-5)
        alone = torch.full((2, 40), NAN)
        linear(mod, fmt, alone, zeroed, *W.to_panels(b))
        assert torch.equal(out[3:5], alone), (name, "a denormal or too-small block must count as zeros")
        first = out if first is None else first
        assert torch.equal(out.nan_to_num(), first.nan_to_num()), (name, "paths differ")


