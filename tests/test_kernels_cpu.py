"""The CPU kernels (csrc/cpu/) against their torch twins, on every instruction-set path this CPU has (avx2,
avx512, and amx with its tiles forced on at every row count).

Outputs are poisoned with NaN before each call, and so is every cache entry the kernel must not read
(past seq_len, and with a window the keys between the sinks and the window); the twin gets zeros there.

Tolerances, kernel vs twin (both fp32):
  linear f32 / f16: the same products summed in another order (the kernel in one chain per output). fp32
      summation of n terms errs by up to ~n eps sum|terms| in the worst case and ~sqrt(n) eps sum|terms| in
      practice (sqrt(1536) * 6e-8 = 2.3e-6): |out - twin| <= 1e-5 * sum_i |w_i x_i|.
  linear int8: the twin reproduces the integer sums exactly and the same fp32 d * dx products; only the
      sum over blocks differs (the kernel fuses it in FMAs, nb <= 48 terms): <= 4e-6 * sum_b |d dx isum|.
  linear q4 / q8 (16-bit activations): the twin reproduces the activations, the exact integer sums and the
      fp32 d * dx and xs; the kernel folds the 2 nb terms in fp32 FMAs, each rounding by at most 2^-24 of the
      running sum, the twin in float64: |out - twin| <= 2 nb 2^-24 sum_b (|d dx S| + |m xs|), the worst case
      of that recursive sum. The integer sums themselves are checked exactly on inputs where the fold cannot
      round (test_q16_exact_sums), and against the dequantized fp32 matmul by the quantization's own bound.
  rmsnorm, silu_mul, rope: a different summation order, exp from a polynomial (~1 ulp), FMA contraction:
      rtol 1e-5 (atol 1e-6 near zero). The residual of add_rmsnorm is the same fp32 add: exact.
  attention: online softmax with the polynomial exp and log-sum-exp merges of splits over up to 4097
      keys: rtol 1e-4, atol 1e-5 (as the CUDA kernel's test).
"""
from __future__ import annotations

import sys
import threading
import time

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


PATHS = ["avx2", "avx512", "amx"]


def best_path(module) -> str:
    return module.isa().split()[0]


@pytest.fixture(params=PATHS)
def m(request, cpu_module):
    """The module switched to one instruction-set path (amx with its tiles at every row count); the best one and
    the AMX crossover are restored afterwards."""
    best, rows = best_path(cpu_module), cpu_module.amx_rows()
    try:
        cpu_module.set_isa(request.param)
    except RuntimeError as e:
        pytest.skip(str(e))
    cpu_module.set_amx_rows(1)
    yield cpu_module
    cpu_module.set_isa(best)
    cpu_module.set_amx_rows(rows)


def each_path(module):
    """(name, module) on every path this CPU runs, amx with its tiles at every row count; restores the best."""
    best, rows = best_path(module), module.amx_rows()
    try:
        for name in PATHS:
            try:
                module.set_isa(name)
            except RuntimeError:
                continue
            module.set_amx_rows(1)
            yield name, module
    finally:
        module.set_isa(best)
        module.set_amx_rows(rows)


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
    elif fmt in ("q4", "q8"):
        want = ref.linear_a16(x, *b.tensors)
        bound = q16_fold_bound(x, b)
    else:
        w = W.dequantize(b)
        want = ref.linear(x, w)
        bound = 1e-5 * (x.abs() @ w.abs().t())
    assert_within(out, want, bound, what)


def q16_fold_bound(x: torch.Tensor, b: W.Blocks) -> torch.Tensor:
    """2 nb 2^-24 sum_b (|d dx S| + |m xs|): the fp32 fold's worst case (header)."""
    x16, dx = ref.quantize_blocks(x, b.q.shape[1], 32767)
    nb = dx.shape[1]
    S = torch.einsum("nbi,obi->nob", x16.double(), b.q.double().view(b.out_features, nb, 32)).abs()
    terms = (b.d.double()[None] * dx.double()[:, None]).abs() * S
    if b.m is not None:
        terms += (b.m.double()[None] * (dx * x16.sum(-1)).double()[:, None]).abs()
    return (2 * nb * 2.0**-24 * terms.sum(-1)).float() + 1e-30


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


def test_linear_handles_no_rows_and_no_inputs(cpu_module):
    b = W.quantize(randn(17, 64, seed=1), "q4")
    linear(cpu_module, "q4", torch.empty(0, 17), torch.empty(0, 64), *W.to_panels(b))
    for fmt in KERNEL_FORMATS:  # a zero-width input: an empty sum, zeros (no block prologue divides by it)
        out = torch.full((3, 17), NAN)
        linear(cpu_module, fmt, out, torch.empty(3, 0), *W.to_panels(W.quantize(torch.empty(17, 0), fmt)))
        assert torch.equal(out, torch.zeros(3, 17)), fmt


@pytest.mark.parametrize("fmt", ["int8", "q4", "q8"])
def test_activation_blocks_with_inf_nan_and_denormals(cpu_module, fmt):
    """The quantized formats' activation blocks, defined for every input (csrc/cpu/q16.h block_scale) and alike
    on every path: a block holding inf or NaN makes its row's outputs NaN, as a float matmul's would be inf or
    NaN; a block of denormals, or of values too small to scale (amax below qmax / FLT_MAX), counts as zeros;
    denormals beside normal values quantize to 0 like any value below half a step. The twin does the same."""
    tiny = 1e-37 if fmt == "int8" else 1e-35  # below 127 / FLT_MAX = 3.7e-37, and below 32767 / FLT_MAX
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
    want = ref.linear_a8(x, b.q, b.d) if fmt == "int8" else ref.linear_a16(x, *b.tensors)
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


def long_call(make, sizes):
    """make(n) for the first n in sizes whose call takes 40 ms or more (the last one otherwise)."""
    for n in sizes:
        call = make(n)
        t = time.perf_counter()
        call()
        if time.perf_counter() - t >= 0.04:
            break
    return call


def share_of_call_python_ran(call) -> float:
    """Another thread makes `call`; meanwhile this one runs a Python loop until the call is done. Returns the loop's
    time over the call's: ~1 when the call releases the GIL; near 0 when it holds it (the loop gets the GIL only
    after the call returns, for one switch interval)."""
    started, done, took = threading.Event(), threading.Event(), []

    def worker():
        started.set()
        t = time.perf_counter()
        call()
        took.append(time.perf_counter() - t)
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        th = threading.Thread(target=worker)
        th.start()
        started.wait()
        t0 = time.perf_counter()
        while not done.is_set():
            pass
        ran = time.perf_counter() - t0
        th.join()
    finally:
        sys.setswitchinterval(interval)
    return ran / took[0]


def native_calls(m) -> dict:
    """name -> make(n): a call of that binding on n rows (keys, tokens), its inputs made once."""
    from functools import partial

    from engine.checkpoint import random_model
    from engine.kv_cache import KVCache
    from engine.tiny import tiny_config

    w = W.to_panels(W.quantize(randn(4096, 1024, seed=51), "fp32"))
    cos = randn(16, 64, seed=58)
    model = random_model(tiny_config(hidden_size=256, intermediate_size=768, max_position_embeddings=4096), seed=60)
    model.ensure_rope(4096)

    def attention(n):
        q, k = randn(1, 64, 32, 128, seed=53), randn(1, 8, n, 128, seed=54)
        return partial(m.attention, torch.empty_like(q), q, k, k, torch.tensor([n], dtype=torch.int32), 0.1, 0, 0)

    def rope(n):
        q = randn(n, 32, 128, seed=59)
        return partial(m.rope, q, q[:, :8], cos, cos, torch.zeros(n, dtype=torch.long))

    def blocks(n):
        cache = KVCache(model.config, 1, n, torch.float32, "cpu")
        cache.set_length(n)
        h = randn(n, 256, seed=61)
        plan = model.ops.blocks.__self__.plan(model, cache)
        return partial(plan.run, h, h, torch.arange(n), model.cos, model.sin, cache.seq_lens, 0, n, 0, 0)

    def rows(n):
        return randn(16 * n, 4096, seed=n)

    return {"linear": lambda n: partial(linear, m, "fp32", torch.empty(n, 4096), randn(n, 1024, seed=52), *w),
            "attention": attention,
            "rmsnorm": lambda n: partial(m.rmsnorm, torch.empty(16 * n, 4096), rows(n), torch.ones(4096), 1e-5),
            "add_rmsnorm": lambda n: partial(m.add_rmsnorm, rows(n), rows(n), torch.ones(4096), 1e-5),
            "silu_mul": lambda n: partial(m.silu_mul, torch.empty(16 * n, 2048), rows(n)),
            "rope": lambda n: rope(16 * n),
            "BlockPlan.run": blocks}


def test_native_calls_release_the_gil(cpu_module):
    """Every binding that does real work (linear, attention, the norms, rope, silu_mul, the block loop) runs
    without the GIL: a Python thread keeps running through a long native call (one kernel thread, so the loop
    has a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, make in native_calls(cpu_module).items():
            share = share_of_call_python_ran(long_call(make, [64, 256, 1024, 4096]))
            assert share > 0.5, f"{name}: a Python thread ran for only {share:.0%} of the native call"
    finally:
        torch.set_num_threads(threads)


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
        gate_up[-1, 3:11] = torch.tensor([NAN, float("inf"), -float("inf"), 88.6, -88.6, 89.0, -89.0, -87.0])
        gate_up[-1, inter + 3] = 1.0
        out = torch.full((rows, inter), NAN)
        m.silu_mul(out, gate_up)
        torch.testing.assert_close(out, ref.silu_mul(gate_up), equal_nan=True, **TOL)


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


@pytest.mark.parametrize("window,sinks", [(0, 0), (64, 4)])
def test_attention_propagates_nan(m, window, sinks):
    """A NaN score makes the output of every query that attends its key NaN, as the twin's softmax does (the
    SIMD exp keeps NaN); a query that does not attend it (another kv head, or the key outside its window) stays
    finite."""
    T, H, Hkv, D, L = 6, 9, 3, 64, 300
    q = randn(1, T, H, D, seed=41)
    k, v = randn(1, Hkv, L + 20, D, seed=42), randn(1, Hkv, L + 20, D, seed=43)
    k[0, 1, 290, 7] = NAN  # kv head 1 (query heads 3-5), in every query's window
    k[0, 2, 100, 0] = NAN  # kv head 2 (query heads 6-8), outside the windowed pass's window
    q[0, 5, 0, 3] = NAN  # query head 0 of the last token
    k_twin, v_twin = k.clone(), v.clone()
    k_twin[:, :, L:], v_twin[:, :, L:] = 0, 0
    k[:, :, L:], v[:, :, L:] = NAN, NAN  # past seq_len: never read
    seq_lens = torch.tensor([L], dtype=torch.int32)
    want = ref.attention(q, k_twin, v_twin, seq_lens, D ** -0.5, window, sinks)
    out = torch.full(want.shape, NAN)
    m.attention(out, q, k, v, seq_lens, D ** -0.5, window, sinks)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert out[0, :, 3:6].isnan().all() and out[0, 5, 0].isnan().all()
    assert out[0, :, 6:9].isnan().all() if window == 0 else not out[0, :, 6:9].isnan().any()
    assert not out[0, :5, :3].isnan().any()


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
    with pytest.raises(RuntimeError, match="q4 weights are 1 packed tensor"):
        linear(m, "q4", out, x, qs, d)
    (w4,) = W.to_panels(W.quantize(torch.randn(17, 100), "q4"))
    with pytest.raises(RuntimeError, match=r"w must be \[P, nb, 320\] = \[2, 4, 320\], got \[2, 3, 320\]"):
        linear(m, "q4", out, x, w4[:, :3].contiguous())
    with pytest.raises(RuntimeError, match=r"unknown weight format code 9 \(0\.\.4: "):
        m.linear(out, x, 9, [qs, d])
    with pytest.raises(RuntimeError, match=r"weight must be \[hidden\] = \[8\], got \[9\]"):
        m.rmsnorm(torch.empty(2, 8), torch.randn(2, 8), torch.ones(9), 1e-5)
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
