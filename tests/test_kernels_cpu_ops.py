"""The CPU row-wise ops (csrc/cpu/rowwise.h) and attention (attention.h) against their torch twins on every
instruction-set path (tests/cpu_paths.py), and every binding's release of the GIL.

Outputs are poisoned with NaN before each call, and so is every cache entry the kernel must not read
(past seq_len, and with a window the keys between the sinks and the window): a key row there may be read into a
lane the mask drops, never counted; the twin gets zeros there.

Tolerances, kernel vs twin (both fp32):
  rmsnorm (and per head), silu_mul, gelu_tanh_mul, rope: a different summation order, exp from a polynomial
      (~1 ulp), FMA contraction: rtol 1e-5 (atol 1e-6 near zero). The residual of add_rmsnorm is the same fp32
      add: exact.
  attention: online softmax with the polynomial exp and log-sum-exp merges of splits over up to 4097
      keys: rtol 1e-4, atol 1e-5 (as the CUDA kernel's test).
"""
from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from cpu_paths import NAN, linear, randn
from engine import weights as W
from engine.ops import ref


# --- the GIL ------------------------------------------------------------------------------------------


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
        return partial(plan.run, h, h, torch.arange(n), cache.seq_lens, 0, n, 0, 0)

    def rows(n):
        return randn(16 * n, 4096, seed=n)

    return {"linear": lambda n: partial(linear, m, "fp32", torch.empty(n, 4096), randn(n, 1024, seed=52), *w),
            "attention": attention,
            "rmsnorm": lambda n: partial(m.rmsnorm, torch.empty(16 * n, 4096), rows(n), torch.ones(4096), 1e-5),
            "add_rmsnorm": lambda n: partial(m.add_rmsnorm, rows(n), rows(n), torch.ones(4096), 1e-5),
            "silu_mul": lambda n: partial(m.silu_mul, torch.empty(16 * n, 2048), rows(n)),
            "gelu_tanh_mul": lambda n: partial(m.gelu_tanh_mul, torch.empty(16 * n, 2048), rows(n)),
            "rmsnorm_heads": lambda n: partial(m.rmsnorm_heads, rows(n).view(16 * n, 32, 128), torch.ones(128), 1e-5),
            "rope": lambda n: rope(16 * n),
            "logsumexp": lambda n: partial(m.logsumexp, torch.empty(16 * n), rows(n)),
            "softmax": lambda n: partial(m.softmax, torch.empty(16 * n, 4096), rows(n), 0.7),
            "nucleus": lambda n: partial(m.nucleus, torch.empty(16 * n, 4096), rows(n), 0.7, 40, 0.9),
            "race": lambda n: partial(m.race, torch.empty(16 * n, dtype=torch.long), rows(n).abs(),
                                      list(range(16 * n))),
            "exp_noise": lambda n: partial(m.exp_noise, torch.empty(16 * 4096 * n), 12345),
            "BlockPlan.run": blocks}


def test_native_calls_release_the_gil(cpu_module):
    """Every binding that does real work (linear, attention, the norms, rope, the gated activations, logsumexp,
    softmax, nucleus, race, exp_noise, the block loop) runs without the GIL: a Python thread keeps running through a
    long native call (one kernel thread, so the loop has a core)."""
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
    """q as a view of a fused qkv projection; the cache with NaN wherever nothing may count (a key row there may be
    read into a lane the mask drops; a value row never)."""
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


@pytest.mark.parametrize("H,Hkv,D", [(9, 3, 64), (12, 2, 128), (8, 1, 40)])
def test_attention_over_an_fp16_cache_is_over_its_values_in_fp32(m, H, Hkv, D):
    """An fp16 cache is read as its values widened to fp32 exactly: the output is bit for bit the output over an
    fp32 cache holding those values (the same sums in the same order, so a decode step and a verify pass agree as
    they do there), at every T, with and without a window; the twin over the fp16 cache agrees to tolerance."""
    for ctx in (1, 257, 700):
        for T in (1, 6, 17):
            for window, sinks in ((0, 0), (64, 4)):
                if ctx < T:
                    continue
                q, k, v, seq_lens, _ = attention_case([ctx], T, H, Hkv, D, window, sinks, seed=ctx + D + T)
                k16, v16 = k.half(), v.half()  # dead positions stay NaN
                out16, out32 = (torch.full((1, T, H, D), NAN) for _ in range(2))
                m.attention(out16, q, k16, v16, seq_lens, D ** -0.5, window, sinks)
                m.attention(out32, q, k16.float(), v16.float(), seq_lens, D ** -0.5, window, sinks)
                case = f"ctx={ctx} T={T} window={window}"
                assert torch.isfinite(out16).all() and torch.equal(out16, out32), case
                want = ref.attention(q, k16.nan_to_num(0), v16.nan_to_num(0), seq_lens, D ** -0.5, window, sinks)
                torch.testing.assert_close(out16, want, rtol=1e-4, atol=1e-5, msg=lambda e, case=case: f"{case}: {e}")


def test_attention_refuses_caches_of_two_dtypes_or_another(cpu_module):
    q, k, v, seq_lens, _ = attention_case([40], 1, 9, 3, 64, 0, 0, seed=1)
    out = torch.empty(1, 1, 9, 64)
    with pytest.raises(RuntimeError, match="v_cache must be Half, got Float"):
        cpu_module.attention(out, q, k.half(), v, seq_lens, 0.125, 0, 0)
    with pytest.raises(RuntimeError, match="k_cache must be float32 or float16, got BFloat16"):
        cpu_module.attention(out, q, k.bfloat16(), v.bfloat16(), seq_lens, 0.125, 0, 0)


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


@pytest.mark.parametrize("T", [1, 6, 17])
def test_attention_reads_key_rows_the_same_way_wherever_they_lie(m, T):
    """A group of 16 keys inside a dense cache is read from one base pointer (attention.h dot16_dense), one that
    crosses the cache's end or a cache with padded rows through a pointer per key: the same bits either way. The
    live length is the cache's last position and not a multiple of 16, so the last group crosses the end."""
    H, Hkv, D, L = 9, 3, 64, 300
    q, k, v, seq_lens, want = attention_case([L], T, H, Hkv, D, 0, 0, seed=T)
    outs = []
    for extra, pad in ((0, 0), (20, 0), (0, 16)):  # the cache ends at L; 20 positions more; rows of D + 16
        kc, vc = (torch.full((1, Hkv, L + extra, D + pad), NAN) for _ in range(2))
        kc[:, :, :L, :D], vc[:, :, :L, :D] = k[:, :, :L], v[:, :, :L]
        kc, vc = kc[..., :D], vc[..., :D]
        assert kc.stride(2) == D + pad
        out = torch.full((1, T, H, D), NAN)
        m.attention(out, q, kc, vc, seq_lens, D ** -0.5, 0, 0)
        outs.append(out)
    torch.testing.assert_close(outs[0], want, rtol=1e-4, atol=1e-5)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


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
    k[:, :, L:], v[:, :, L:] = NAN, NAN  # past seq_len: never counted
    seq_lens = torch.tensor([L], dtype=torch.int32)
    want = ref.attention(q, k_twin, v_twin, seq_lens, D ** -0.5, window, sinks)
    out = torch.full(want.shape, NAN)
    m.attention(out, q, k, v, seq_lens, D ** -0.5, window, sinks)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert out[0, :, 3:6].isnan().all() and out[0, 5, 0].isnan().all()
    assert out[0, :, 6:9].isnan().all() if window == 0 else not out[0, :, 6:9].isnan().any()
    assert not out[0, :5, :3].isnan().any()


