"""The CPU kernels (csrc/cpu/) against their torch twins, on every instruction-set path this CPU has.

Outputs are poisoned with NaN before each call, and so is every cache entry the kernel must not read
(past seq_len, and with a window the keys between the sinks and the window); the twin gets zeros there.

Tolerances, kernel vs twin (both fp32):
  linear f32 / f16 / q4: the same products summed in another order (the kernel in 16-lane chains, q4 per
      block as d * sum(q x) + m * sum(x) where the twin dequantizes w = d q + m first). fp32 summation
      of n terms errs by up to ~n eps sum|terms| in the worst case and ~sqrt(n) eps sum|terms| in practice
      (sqrt(1536) * 6e-8 = 2.3e-6): |out - twin| <= 1e-5 * sum_i |w_i x_i|.
  linear q8: the twin reproduces the integer sums exactly and the same fp32 d * dx products; only the
      sum over blocks differs (the kernel fuses it in FMAs, nb <= 48 terms): <= 4e-6 * sum_b |d dx isum|.
  rmsnorm (and per head), silu_mul, gelu_tanh_mul, rope: a different summation order, exp from a polynomial
      (~1 ulp), FMA contraction: rtol 1e-5 (atol 1e-6 near zero). The residual of add_rmsnorm is the same fp32
      add: exact.
  attention: online softmax with the polynomial exp and log-sum-exp merges of splits over up to 4097
      keys: rtol 1e-4, atol 1e-5 (as the CUDA kernel's test).
"""
from __future__ import annotations

import threading

import pytest
import torch

from engine.ops import ext
from engine import weights as W
from engine.ops import ref

NAN = float("nan")
KERNEL_FORMATS = W.PANEL_FORMATS  # every format with a CPU kernel, q8 (a q4 model's head) included


def linear(m, fmt: str, out: torch.Tensor, x: torch.Tensor, *tensors: torch.Tensor) -> None:
    """The module's one linear, for the format named as engine/weights names it."""
    m.linear(out, x, m.formats().index(fmt), list(tensors))


@pytest.fixture(scope="module")
def cpu_module():
    status = ext.load("cpu")
    if status.module is None:
        pytest.skip(f"the CPU kernels did not build: {status.reason}")
    return status.module


@pytest.fixture(params=["avx2", "avx512"])
def m(request, cpu_module):
    """The module switched to one instruction-set path; the best one is restored afterwards."""
    best = "avx512" if cpu_module.isa().startswith("avx512") else "avx2"
    try:
        cpu_module.set_isa(request.param)
    except RuntimeError as e:
        pytest.skip(str(e))
    yield cpu_module
    cpu_module.set_isa(best)


def randn(*shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# --- GEMM ---------------------------------------------------------------------------------------------

IN_SIZES = [32, 64, 100, 576, 1536]
OUT_SIZES = [1, 15, 16, 17, 769]
ROWS = [1, 2, 5, 6, 16, 17, 33]


def check_linear(m, fmt: str, b: W.Blocks, x: torch.Tensor, what: str) -> None:
    out = torch.full((x.shape[0], b.out_features), NAN)
    linear(m, fmt, out, x, *W.to_panels(b))
    if fmt == "int8":
        qx, dx = ref.quantize_activations(x, b.q.shape[1])
        sums = torch.einsum("nbi,obi->nob", qx, b.q.float().view(b.out_features, -1, 32))
        want = ref.linear_a8(x, b.q, b.d)
        bound = 4e-6 * ((b.d.float()[None] * dx[:, None]).abs() * sums.abs()).sum(-1)
    else:
        w = W.dequantize(b)
        want = ref.linear(x, w)
        bound = 1e-5 * (x.abs() @ w.abs().t())
    assert_within(out, want, bound, what)


def assert_within(out: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    excess = (out - want).abs() - bound
    assert not out.isnan().any(), f"{what}: NaN in the output"
    assert excess.max() <= 0, f"{what}: |out - twin| exceeds the bound by {excess.max():.3g}"


@pytest.mark.parametrize("fmt", KERNEL_FORMATS)
@pytest.mark.parametrize("n_in", IN_SIZES)
def test_linear(m, fmt, n_in):
    x_all = randn(max(ROWS), n_in, seed=n_in, scale=2.0)
    for out in OUT_SIZES:
        b = W.quantize(randn(out, n_in, seed=out + n_in), fmt)
        for T in ROWS:
            check_linear(m, fmt, b, x_all[:T].contiguous(), f"{m.isa()} {fmt} out={out} in={n_in} T={T}")


def test_q4_kernel_equals_dequantize_then_matmul(cpu_module):
    """The lossless-q4 promise: quantize -> pack -> kernel gives the fp32 model's matmul of the same
    (dequantized) weights, to fp32 rounding."""
    w = randn(300, 576, seed=11)
    x = randn(3, 576, seed=12)
    b = W.quantize(w, "q4")
    out = torch.empty(3, 300)
    linear(cpu_module, "q4", out, x, *W.to_panels(b))
    w_fp32 = W.dequantize(b)
    assert_within(out, x @ w_fp32.t(), 1e-5 * (x.abs() @ w_fp32.abs().t()), "q4 vs the fp32 matmul")


def test_prefill_rows_and_a_large_panel_count(cpu_module):
    """128 rows (prefill, many row tiles per panel) and 300 panels split across threads."""
    for fmt in KERNEL_FORMATS:
        b = W.quantize(randn(4800, 100, seed=5), fmt)
        check_linear(cpu_module, fmt, b, randn(128, 100, seed=6), f"{fmt} T=128")


@pytest.mark.parametrize("fmt", ["int8", "q8"])
def test_tied_head_in_8_bit_blocks(cpu_module, fmt):
    """The default model's tied head [49152, 576], int8 in an int8 model, q8 in a q4 one: the biggest panel
    count a step runs."""
    b = W.quantize(randn(49152, 576, seed=7, scale=0.05), fmt)
    check_linear(cpu_module, fmt, b, randn(2, 576, seed=8), f"{fmt} head")


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


# --- row-wise ops -------------------------------------------------------------------------------------

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hidden", [111, 576, 769, 2048])
def test_norms(m, hidden):
    for rows in (1, 5, 300):  # 300 rows split across threads
        x = randn(rows, hidden, seed=hidden, scale=3)
        w = randn(hidden, seed=hidden + 1)
        out = torch.full_like(x, NAN)
        m.rmsnorm(out, x, w, 1e-5)
        torch.testing.assert_close(out, ref.rmsnorm(x, w, 1e-5), **TOL)
        residual = randn(rows, hidden, seed=hidden + 2, scale=4)
        x_ref, r_ref = x.clone(), residual.clone()
        ref.add_rmsnorm(x_ref, r_ref, w, 1e-6)
        m.add_rmsnorm(x, residual, w, 1e-6)
        torch.testing.assert_close(residual, r_ref, rtol=0, atol=0)
        torch.testing.assert_close(x, x_ref, **TOL)
    y = randn(2, hidden, seed=3)
    m.rmsnorm(y, y, w, 1e-5)  # in place
    torch.testing.assert_close(y, ref.rmsnorm(randn(2, hidden, seed=3), w, 1e-5), **TOL)


@pytest.mark.parametrize("inter", [111, 1536, 769])
def test_silu_mul(m, inter):
    for rows in (1, 4, 100):
        gate_up = randn(rows, 2 * inter, seed=inter, scale=6)
        gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -88.5])  # exp's clamps
        out = torch.full((rows, inter), NAN)
        m.silu_mul(out, gate_up)
        torch.testing.assert_close(out, ref.silu_mul(gate_up), **TOL)


@pytest.mark.parametrize("inter", [111, 1536, 2048])
def test_gelu_tanh_mul(m, inter):
    """Gemma's GeGLU gate: gelu's tanh form, computed as g * sigmoid(2u) with the same exp as silu. The twin (and
    transformers) compute 0.5 g (1 + tanh(u)), which loses what lies below 1's ulp (6e-8) where tanh saturates
    (g < -4): there the two differ by up to an ulp of 1 times |gate * up|, the twin's rounding, on top of TOL."""
    for rows in (1, 4, 100):
        gate_up = randn(rows, 2 * inter, seed=inter + 7, scale=4)
        gate_up[0, :5] = torch.tensor([-100.0, 100.0, 0.0, -12.0, 1e-4])  # exp's clamps, tanh's flat ends, ~0
        out = torch.full((rows, inter), NAN)
        m.gelu_tanh_mul(out, gate_up)
        want = ref.gelu_tanh_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        bound = TOL["rtol"] * want.abs() + TOL["atol"] + 1.2e-7 * (gate * up).abs()
        assert ((out - want).abs() <= bound).all(), (out - want).abs().max()


@pytest.mark.parametrize("heads,head_dim", [(4, 256), (9, 64), (3, 6)])
def test_rmsnorm_heads(m, heads, head_dim):
    """The q/k norms in place on the q part of a qkv output (dense heads, a token stride past them): the rest of
    each token's row (here NaN: the k and v parts) is neither read nor written."""
    for tokens in (1, 3, 200):
        qkv = torch.full((tokens, 3 * heads * head_dim), NAN)
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        q.copy_(randn(tokens, heads, head_dim, seed=heads, scale=3))
        w = randn(head_dim, seed=head_dim)
        want = ref.rmsnorm(q.reshape(-1, head_dim), w, 1e-6).view_as(q)
        m.rmsnorm_heads(q, w, 1e-6)
        torch.testing.assert_close(q, want, **TOL)
        assert qkv[:, heads * head_dim:].isnan().all()


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(9, 3, 64), (32, 8, 128), (4, 2, 6)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_rope(m, n_heads, n_kv_heads, head_dim, pos_dtype):
    N, max_pos = 5, 4100
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    cos, sin = ang.cos().float(), ang.sin().float()
    positions = torch.tensor([4099, 0, 7, 7, 300], dtype=pos_dtype)
    # q and k as views of one fused qkv row, as a projection produces them: token stride > H * D
    qkv = randn(N, (n_heads + 2 * n_kv_heads) * head_dim, seed=head_dim + n_heads)
    q = qkv[:, : n_heads * head_dim].view(N, n_heads, head_dim)
    k = qkv[:, n_heads * head_dim: (n_heads + n_kv_heads) * head_dim].view(N, n_kv_heads, head_dim)
    q_ref, k_ref = q.clone(), k.clone()
    ref.rope_(q_ref, k_ref, cos, sin, positions)
    v_before = qkv[:, (n_heads + n_kv_heads) * head_dim:].clone()
    m.rope(q, k, cos, sin, positions)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(k, k_ref, **TOL)
    assert torch.equal(qkv[:, (n_heads + n_kv_heads) * head_dim:], v_before)


# --- attention ----------------------------------------------------------------------------------------

CONTEXTS = [1, 255, 256, 257, 4097]
WINDOWS = [(0, 0), (4, 0), (4, 4), (64, 4)]  # (window, sinks)


def attention_case(lens, T, H, Hkv, D, window, sinks, seed):
    """q as a view of a fused qkv projection; the cache with NaN wherever the kernel must not read."""
    B, S = len(lens), max(lens) + 37
    qkv = randn(B, T, (H + 2 * Hkv) * D, seed=seed)
    q = qkv[..., : H * D].view(B, T, H, D)
    k, v = randn(B, Hkv, S, D, seed=seed + 1), randn(B, Hkv, S, D, seed=seed + 2)
    k_twin, v_twin = k.clone(), v.clone()
    for b, n in enumerate(lens):
        dead = torch.arange(S) >= n
        if window > 0:  # keys no query of the row attends: past the sinks, before the first query's window
            dead |= (torch.arange(S) >= sinks) & (torch.arange(S) <= n - T - window)
        k[b, :, dead], v[b, :, dead] = NAN, NAN
        k_twin[b, :, dead], v_twin[b, :, dead] = 0, 0
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return q, k, v, seq_lens, ref.attention(q, k_twin, v_twin, seq_lens, D ** -0.5, window, sinks)


@pytest.mark.parametrize("H,Hkv", [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("D", [64, 128, 40])
def test_attention(m, H, Hkv, D):
    for ctx in CONTEXTS:
        for T in (1, 6):
            for window, sinks in WINDOWS:
                if ctx < T:
                    continue
                q, k, v, seq_lens, want = attention_case([ctx], T, H, Hkv, D, window, sinks, seed=ctx + D)
                out = torch.full((1, T, H, D), NAN)
                m.attention(out, q, k, v, seq_lens, D ** -0.5, window, sinks)
                case = f"ctx={ctx} T={T} window={window} sinks={sinks}"
                torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5, msg=lambda e, case=case: f"{case}: {e}")


def test_attention_batch_sliced_cache_and_long_verify(cpu_module):
    """Rows of different lengths; the model's k[layer][:, :, :limit] view (head stride the full S_max);
    T = 17 and 40 (more queries than a tile holds)."""
    for T, window, sinks in [(1, 0, 0), (6, 64, 4), (17, 0, 0), (40, 16, 2)]:
        q, k, v, seq_lens, want = attention_case([700, 40, 300], T, 9, 3, 64, window, sinks, seed=T)
        kc, vc = k[:, :, :720], v[:, :, :720]
        assert not kc.is_contiguous()
        out = torch.full((3, T, 9, 64), NAN)
        cpu_module.attention(out, q, kc, vc, seq_lens, 0.125, window, sinks)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)


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
    qs, d = W.to_panels(W.quantize(torch.randn(17, 100), "int8"))
    with pytest.raises(RuntimeError, match=r"d must be \[P, nb, 16\] = \[2, 4, 16\], got \[2, 4, 15\]"):
        linear(m, "int8", out, x, qs, d[..., :15].contiguous())
    with pytest.raises(RuntimeError, match="x must be Float, got Double"):
        linear(m, "q8", out, x.double(), qs, d)
    with pytest.raises(RuntimeError, match="q4 weights are 3 packed tensor"):
        linear(m, "q4", out, x, qs, d)
    with pytest.raises(RuntimeError, match=r"unknown weight format code 9 \(0\.\.4: "):
        m.linear(out, x, 9, [qs, d])
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
    with pytest.raises(RuntimeError, match="isa must be 'avx2' or 'avx512', got 'sse'"):
        m.set_isa("sse")


def test_reports_what_it_runs(cpu_module):
    assert cpu_module.unsupported() == ""
    assert cpu_module.isa() in ("avx2", "avx512 (vnni)")
    assert cpu_module.isa() in ext.load("cpu").reason
