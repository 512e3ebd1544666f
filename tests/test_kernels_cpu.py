"""The CPU GEMMs (csrc/cpu/gemm.h, kquants.h, legacy.h, amx.h, q16.h) against their torch twins, on every
instruction-set path this CPU has (avx2, avx512, and amx with its tiles forced on at every row count;
tests/cpu_paths.py). Outputs are poisoned with NaN before each call. The quantized formats' activations (their
error, exact integer sums, inf / NaN / denormal blocks): tests/test_kernels_cpu_activations.py; the row-wise ops,
attention and the GIL: tests/test_kernels_cpu_ops.py.

Tolerances, kernel vs twin (both fp32):
  linear f32 / f16: the same products summed in another order (the kernel in one chain per output). fp32
      summation of n terms errs by up to ~n eps sum|terms| in the worst case and ~sqrt(n) eps sum|terms| in
      practice (sqrt(1536) * 6e-8 = 2.3e-6): |out - twin| <= 1e-5 * sum_i |w_i x_i|.
  linear int8 (and q4_0 / q5_0, whose Blocks are int8's): the twin reproduces the integer sums exactly and
      the same fp32 d * dx products; only the sum over blocks differs (the kernel fuses it in FMAs, nb <= 48
      terms): <= 4e-6 * sum_b |d dx isum|.
  linear q4 / q8 (16-bit activations): the twin reproduces the activations, the exact integer sums and the
      fp32 d * dx and xs; the kernel folds the 2 nb terms in fp32 FMAs, each rounding by at most 2^-24 of the
      running sum, the twin in float64: |out - twin| <= 2 nb 2^-24 sum_b (|d dx S| + |m xs|), the worst case
      of that recursive sum. The integer sums themselves are checked exactly on inputs where the fold cannot
      round (test_q16_exact_sums), and against the dequantized fp32 matmul by the quantization's own bound.
  linear q4_k / q5_k / q6_k (Q8_K activations): the twin reproduces the activations, each super-block's exact
      integer sums and their one rounding to fp32, and the fp32 d * dx and dmin * dx; the kernel folds the (up
      to) 2 ns terms in fp32 FMAs, the twin in float64: |out - twin| <= 2 ns 2^-24 sum_s |term_s|, as q4's.
      Their exact integer sums: test_k_quant_exact_sums.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import threading

import pytest
import torch

from cpu_paths import K_QUANTS, KERNEL_FORMATS, NAN, assert_within, each_path, linear, randn
from engine import weights as W
from engine.ops import ext, ref


# --- GEMM ---------------------------------------------------------------------------------------------

IN_SIZES = [32, 64, 100, 576, 1536]
OUT_SIZES = [1, 15, 16, 17, 769]
ROWS = [1, 2, 5, 6, 16, 17, 33]


def check_linear(m, fmt: str, b: W.Blocks, x: torch.Tensor, what: str) -> None:
    out = torch.full((x.shape[0], b.out_features), NAN)
    linear(m, fmt, out, x, *W.to_panels(b))
    if W.get(fmt).cpu_activations == "int8":  # int8, and q4_0 / q5_0 whose Blocks are int8's
        qx, dx = ref.quantize_activations(x, b.q.shape[1])
        sums = torch.einsum("nbi,obi->nob", qx, b.q.float().view(b.out_features, -1, 32))
        want = ref.linear_a8(x, *b.tensors)
        bound = 4e-6 * ((b.d.float()[None] * dx[:, None]).abs() * sums.abs()).sum(-1)
        if b.m is not None:  # q4_a8: Q4_1's min term, folded as q4's
            bound = q16_fold_bound(x, b, 127)
    elif fmt in ("q4", "q8"):
        want = ref.linear_a16(x, *b.tensors)
        bound = q16_fold_bound(x, b)
    elif W.get(fmt).cpu_activations == "q8_k":
        want = ref.linear_q8_k(x, b.q, b.d, b.sc, b.m, b.mn)
        bound = q8k_fold_bound(x, b)
    else:
        w = W.dequantize(b)
        want = ref.linear(x, w)
        bound = 1e-5 * (x.abs() @ w.abs().t())
    assert_within(out, want, bound, what)


def q16_fold_bound(x: torch.Tensor, b: W.Blocks, qmax: int = 32767) -> torch.Tensor:
    """2 nb 2^-24 sum_b (|d dx S| + |m xs|): the fp32 fold's worst case (header); activations to [-qmax, qmax]."""
    x16, dx = ref.quantize_blocks(x, b.q.shape[1], qmax)
    nb = dx.shape[1]
    S = torch.einsum("nbi,obi->nob", x16.double(), b.q.double().view(b.out_features, nb, 32)).abs()
    terms = (b.d.double()[None] * dx.double()[:, None]).abs() * S
    if b.m is not None:
        terms += (b.m.double()[None] * (dx * x16.sum(-1)).double()[:, None]).abs()
    return (2 * nb * 2.0**-24 * terms.sum(-1)).float() + 1e-30


def q8k_fold_bound(x: torch.Tensor, b: W.Blocks) -> torch.Tensor:
    """2 ns 2^-24 sum_s (|isum d dx| + |imin dmin dx|): the fp32 fold's worst case (header)."""
    qx, dx = ref.quantize_blocks(x, b.q.shape[1], 127, 256)
    ns, out = dx.shape[1], b.out_features
    n_sub = b.sc.shape[1] // ns
    xs = qx.double().view(x.shape[0], ns, n_sub, -1)
    sums = torch.einsum("nsku,osku->nosk", xs, b.q.double().view(out, ns, n_sub, -1))
    scale = (b.d.double()[None] * dx.double()[:, None]).abs()
    terms = (sums * b.sc.double().view(out, ns, n_sub)).sum(-1).abs() * scale
    if b.m is not None:
        imin = (xs.sum(-1)[:, None] * b.mn.double().view(out, ns, n_sub)).sum(-1)
        terms += imin.abs() * (b.m.double()[None] * dx.double()[:, None]).abs()
    return (2 * ns * 2.0**-24 * terms.sum(-1)).float() + 1e-30


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
@pytest.mark.parametrize("n_in", IN_SIZES)
def test_linear(m, fmt, n_in):
    x_all = randn(max(ROWS), n_in, seed=n_in, scale=2.0)
    for out in OUT_SIZES:
        b = W.quantize(randn(out, n_in, seed=out + n_in), fmt)
        for T in ROWS:
            check_linear(m, fmt, b, x_all[:T].contiguous(), f"{m.isa()} {fmt} out={out} in={n_in} T={T}")


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_a_row_is_the_same_bits_at_every_row_count_and_path(cpu_module, fmt):
    """Batch invariance at the kernel: row t of a T-row pass equals the same row computed alone, bit for bit,
    for T = 1..17, across a thread split of the panels; and for the integer-sum formats (int8, q4, q8) and the
    dense ones (one chain per output, the same per-lane operations on 8 or 16 lanes) across every path too."""
    b = W.quantize(randn(300, 576, seed=21), fmt)
    panels = W.to_panels(b)
    x = randn(17, 576, seed=22, scale=3.0)
    alone = {}
    for name, mod in each_path(cpu_module):
        for t in range(17):
            out = torch.full((1, 300), NAN)
            linear(mod, fmt, out, x[t:t + 1].contiguous(), *panels)
            alone.setdefault(t, out[0])
            assert torch.equal(out[0], alone[t]), (name, t, "alone differs between paths")
        for T in range(1, 18):
            out = torch.full((T, 300), NAN)
            linear(mod, fmt, out, x[:T].contiguous(), *panels)
            for t in range(T):
                assert torch.equal(out[t], alone[t]), (name, T, t)


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_k_quant_rows_past_a_chunk_are_a_steps_bits(cpu_module, fmt):
    """A K-quant pass of more rows than a tile unpacks each super-block once for a chunk of 64 rows
    (kquants.h, shared): every row of a 150-row pass (three chunks, the last short) equals the row alone."""
    b = W.quantize(randn(40, 512, seed=23), fmt)
    panels = W.to_panels(b)
    x = randn(150, 512, seed=24, scale=2.0)
    for name, mod in each_path(cpu_module):
        out = torch.full((150, 40), NAN)
        linear(mod, fmt, out, x, *panels)
        for t in (0, 5, 63, 64, 65, 127, 128, 149):
            alone = torch.full((1, 40), NAN)
            linear(mod, fmt, alone, x[t:t + 1].contiguous(), *panels)
            assert torch.equal(out[t], alone[0]), (name, t)


def test_prefill_rows_and_a_large_panel_count(cpu_module):
    """128 rows (prefill, many row tiles per panel) and 300 panels split across threads."""
    for fmt in KERNEL_FORMATS:
        b = W.quantize(randn(4800, 100, seed=5), fmt)
        check_linear(cpu_module, fmt, b, randn(128, 100, seed=6), f"{fmt} T=128")


@pytest.mark.parametrize("fmt", ["int8", "q8"])
def test_tied_head_in_8_bit_blocks(cpu_module, fmt):
    """The default model's tied head [49152, 576], int8 in an int8 model, q8 in a q4 one: the biggest panel
    count a step runs; 12 rows reach the AMX tiles at the default crossover."""
    b = W.quantize(randn(49152, 576, seed=7, scale=0.05), fmt)
    check_linear(cpu_module, fmt, b, randn(12, 576, seed=8), f"{fmt} head")


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
def test_a_slice_of_a_wider_output_gets_the_same_bits(cpu_module, fmt):
    """A stacked weight's segment writes its columns of the projection's output (rows 90 floats apart), starting
    and ending inside a panel of 16: the bits of a call into its own output, and not a column outside the slice."""
    b = W.quantize(randn(37, 576, seed=25), fmt)
    panels = W.to_panels(b)
    for T in (1, 5, 17):
        x = randn(T, 576, seed=26 + T, scale=2.0)
        for name, mod in each_path(cpu_module):
            alone, wide = torch.full((T, 37), NAN), torch.full((T, 90), NAN)
            linear(mod, fmt, alone, x, *panels)
            linear(mod, fmt, wide[:, 21:58], x, *panels)
            assert torch.equal(wide[:, 21:58], alone), (name, T)
            assert wide[:, :21].isnan().all() and wide[:, 58:].isnan().all(), (name, T)


def test_linear_handles_no_rows_and_no_inputs(cpu_module):
    b = W.quantize(randn(17, 64, seed=1), "q4")
    linear(cpu_module, "q4", torch.empty(0, 17), torch.empty(0, 64), *W.to_panels(b))
    for fmt in KERNEL_FORMATS:  # a zero-width input: an empty sum, zeros (no block prologue divides by it)
        out = torch.full((3, 17), NAN)
        linear(cpu_module, fmt, out, torch.empty(3, 0), *W.to_panels(W.quantize(torch.empty(17, 0), fmt)))
        assert torch.equal(out, torch.zeros(3, 17)), fmt


def test_threads_and_concurrent_callers(cpu_module):
    """One thread, and two Python threads calling at once (the second runs its work inline)."""
    b = W.quantize(randn(2000, 576, seed=9), "int8")
    panels = W.to_panels(b)
    x = randn(4, 576, seed=10)
    want = ref.linear_a8(x, b.q, b.d)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = torch.empty(4, 2000)
        linear(cpu_module, "int8", out, x, *panels)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(n)
    outs = [torch.full((4, 2000), NAN) for _ in range(4)]

    def call(y):
        for _ in range(20):
            linear(cpu_module, "int8", y, x, *panels)

    threads = [threading.Thread(target=call, args=(y,)) for y in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for y in outs:
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


# --- bad inputs ---------------------------------------------------------------------------------------


def test_errors_name_the_values(cpu_module):
    m = cpu_module
    x, out = torch.randn(2, 100), torch.empty(2, 17)
    (w,) = W.to_panels(W.quantize(torch.randn(17, 100), "fp32"))
    with pytest.raises(RuntimeError, match=r"w must be \[P, in, 16\] = \[2, 100, 16\], got \[2, 64, 16\]"):
        linear(m, "fp32", out, x, w[:, :64].contiguous())
    with pytest.raises(RuntimeError, match="w must be Float, got Half"):
        linear(m, "fp32", out, x, w.half())
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        linear(m, "fp32", out, torch.randn(100, 2).t(), w)
    with pytest.raises(RuntimeError, match=r"out must be \[T, out\] with T = 2, got \[3, 17\]"):
        linear(m, "fp32", torch.empty(3, 17), x, w)
    with pytest.raises(RuntimeError, match=r"out's rows must be dense and apart \(strides \[>= 17, 1\]\), got "
                                           r"strides \[1, 2\]"):
        linear(m, "fp32", torch.empty(17, 2).t(), x, w)
    buf = torch.randn(234)  # x's second row lies between the rows of a slice of a wider output
    with pytest.raises(RuntimeError, match="out must not overlap x"):
        linear(m, "fp32", buf.as_strided((2, 17), (117, 1), 100), buf[:200].view(2, 100), w)
    qs, d = W.to_panels(W.quantize(torch.randn(17, 100), "int8"))
    with pytest.raises(RuntimeError, match=r"d must be \[P, nb, 16\] = \[2, 4, 16\], got \[2, 4, 15\]"):
        linear(m, "int8", out, x, qs, d[..., :15].contiguous())
    with pytest.raises(RuntimeError, match="x must be Float, got Double"):
        linear(m, "q8", out, x.double(), qs, d)
    with pytest.raises(RuntimeError, match="q4 weights are 1 packed tensor"):
        linear(m, "q4", out, x, qs, d)
    (w4,) = W.to_panels(W.quantize(torch.randn(17, 100), "q4"))
    with pytest.raises(RuntimeError, match=r"w must be \[P, nb, 320\] = \[2, 4, 320\], got \[2, 3, 320\]"):
        linear(m, "q4", out, x, w4[:, :3].contiguous())
    with pytest.raises(RuntimeError, match=rf"unknown weight format code 99 \(0\.\.{len(KERNEL_FORMATS) - 1}: "):
        m.linear(out, x, 99, [qs, d])
    (wk,) = W.to_panels(W.quantize(torch.randn(17, 100), "q6_k"))
    with pytest.raises(RuntimeError, match=r"w must be \[P, ns, 3360\] = \[2, 1, 3360\], got \[2, 1, 2304\]"):
        linear(m, "q6_k", out, x, wk[..., :2304].contiguous())
    with pytest.raises(RuntimeError, match=r"weight must be \[hidden\] = \[8\], got \[9\]"):
        m.rmsnorm(torch.empty(2, 8), torch.randn(2, 8), torch.ones(9), 1e-5)
    with pytest.raises(RuntimeError, match=r"weight must be \[hidden\] = \[8\], got \[16\]"):
        m.rmsnorm_heads(torch.randn(2, 4, 8), torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="x must have dense heads"):
        m.rmsnorm_heads(torch.randn(2, 8, 4).transpose(1, 2), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match=r"out must be \[\.\.\., I\] = \[2, 4\], got \[2, 5\]"):
        m.gelu_tanh_mul(torch.empty(2, 5), torch.randn(2, 8))
    cos = torch.randn(10, 32)
    with pytest.raises(RuntimeError, match=r"positions\[1\] = 10 is outside the table \[0, 10\)"):
        m.rope(torch.randn(2, 3, 64), torch.randn(2, 1, 64), cos, cos, torch.tensor([0, 10]))
    q, cache = torch.randn(1, 6, 4, 64), torch.randn(1, 2, 16, 64)
    with pytest.raises(RuntimeError, match=r"seq_lens\[0\] = 5 must be in \[T, S\] = \[6, 16\]"):
        m.attention(torch.empty_like(q), q, cache, cache, torch.tensor([5], dtype=torch.int32), 0.1, 0, 0)
    with pytest.raises(RuntimeError, match="seq_lens must be Int, got Long"):
        m.attention(torch.empty_like(q), q, cache, cache, torch.tensor([8]), 0.1, 0, 0)
    with pytest.raises(RuntimeError, match="head_dim must be even and at most 256, got D = 63"):
        m.attention(torch.empty(1, 1, 4, 63), torch.randn(1, 1, 4, 63), torch.randn(1, 2, 4, 63),
                    torch.randn(1, 2, 4, 63), torch.tensor([3], dtype=torch.int32), 0.1, 0, 0)
    with pytest.raises(RuntimeError, match="isa must be 'avx2', 'avx512' or 'amx', got 'sse'"):
        m.set_isa("sse")
    with pytest.raises(RuntimeError, match=r"rows must be in \[1, 2\^20\], got 0"):
        m.set_amx_rows(0)


def test_reports_what_it_runs(cpu_module):
    assert cpu_module.unsupported() == ""
    isa = cpu_module.isa()
    assert isa == "avx2" or isa.startswith(("avx512 (vnni)", "amx (int8 tiles from T >= ")), isa
    assert isa in ext.load("cpu").reason
    if isa.startswith("amx"):
        assert f"T >= {cpu_module.amx_rows()}" in isa


# An AVX-512 or AMX instruction: a 512-bit or tile register, a mask register, or an EVEX-only mnemonic.
_NOT_AVX2 = re.compile(r"%zmm|%tmm|\{%k[0-7]\}|%k[0-7]\b|vinserti(32|64)x|vextracti(32|64)x|vmovdqu(8|16|32|64)\b|"
                       r"vpternlog|vpdpbusd|tdp|tileload")


def test_no_code_of_another_isa_runs_to_hand_out_a_table(cpu_module):
    """The library's static initializers and the three table accessors run on any CPU that loads it; none may hold
    an AVX-512 or AMX instruction (a table built at first call did, and an AVX2-only CPU died of SIGILL in isa())."""
    nm, objdump = shutil.which("nm"), shutil.which("objdump")
    if not nm or not objdump:
        pytest.skip("needs binutils' nm and objdump to read the built library")
    so = cpu_module.__file__
    symbols = subprocess.run([nm, so], capture_output=True, text=True, check=True).stdout.split("\n")
    names = [line.split()[-1] for line in symbols if line.strip()]
    accessors = [n for n in names if re.fullmatch(r"_ZN11decodescope3cpu\d+(avx2|avx512|amx)_tableEv", n)]
    initializers = [n for n in names if n.startswith("_GLOBAL__sub_I_")]
    assert len(accessors) == 3, accessors
    for name in accessors + initializers:
        listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", f"--disassemble={name}", so],
                                 capture_output=True, text=True, check=True).stdout
        body = listing.split(f"<{name}>:", 1)[1].split("Disassembly of section", 1)[0]
        found = _NOT_AVX2.search(body)
        assert found is None, f"{name} holds {found.group(0)!r}, which an AVX2-only CPU cannot run:\n{body[:2000]}"
