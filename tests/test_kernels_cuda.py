"""Each fused kernel against its torch twin, through the wrappers in engine/ops/cuda.py, on both backends of
tests/cuda_backends.py: the built extension on a GPU, and the same kernel source on CPU threads.

Outputs are poisoned with NaN before each launch, and so is every cache entry a row does not attend (past
seq_len, and the middle a window skips): the twin gets zeros there (it multiplies masked keys by 0, and
0 * NaN is NaN), so a kernel that reads one shows NaN.

Tolerances, kernel vs twin (both compute in fp32 and round once):
  rmsnorm, silu_mul, rope: a different summation order, rsqrtf/expf and FMA contraction leave ~1e-6
      relative in fp32 -> fp32 rtol 1e-5; bf16/fp16 may round that to the neighbouring value: one ulp,
      rtol = finfo(dtype).eps, with atol 1e-5 for outputs near zero.
  add_rmsnorm's residual: the same fp32 sum rounded once, so exact.
  decode_attention: online softmax with ex2.approx (2 ulp) and split merges over up to 4097 keys -> fp32
      rtol 1e-4, atol 1e-5; bf16/fp16 one ulp as above.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_backends import DTYPES, NAN, EmulatedModule, make_backend, randn, tol
from engine.ops import ext
from engine.ops import cuda, ref

@pytest.fixture(scope="module", params=["cuda", pytest.param("emulated", marks=pytest.mark.emulation)])
def backend(request):
    return make_backend(request.param)


# --- elementwise and norms ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [111, 576, 769, 2048])
def test_rmsnorm(backend, dtype, hidden):
    x = randn(5, hidden, dtype=dtype, device=backend.device, scale=3, seed=hidden)
    w = randn(hidden, dtype=dtype, device=backend.device, seed=hidden + 1)
    out = torch.full_like(x, NAN)
    assert backend.ops.rmsnorm(x, w, 1e-5, out=out) is out
    torch.testing.assert_close(out, ref.rmsnorm(x, w, 1e-5), **tol(dtype))
    y = backend.ops.rmsnorm(x[:1], w, 1e-5)  # one row, allocated by the wrapper
    torch.testing.assert_close(y, ref.rmsnorm(x[:1], w, 1e-5), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [111, 576, 769, 2048])
def test_add_rmsnorm(backend, dtype, hidden):
    x = randn(3, hidden, dtype=dtype, device=backend.device, seed=hidden)
    residual = randn(3, hidden, dtype=dtype, device=backend.device, scale=4, seed=hidden + 2)
    w = randn(hidden, dtype=dtype, device=backend.device, seed=hidden + 3)
    x_ref, r_ref = x.clone(), residual.clone()
    ref.add_rmsnorm(x_ref, r_ref, w, 1e-6)
    assert backend.ops.add_rmsnorm(x, residual, w, 1e-6) is x
    torch.testing.assert_close(residual, r_ref, rtol=0, atol=0)
    torch.testing.assert_close(x, x_ref, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [111, 576, 769, 2048])
def test_silu_mul(backend, dtype, inter):
    gate_up = randn(4, 2 * inter, dtype=dtype, device=backend.device, scale=4, seed=inter)
    out = torch.full((4, inter), NAN, dtype=dtype, device=backend.device)
    assert backend.ops.silu_mul(gate_up, out=out) is out
    torch.testing.assert_close(out, ref.silu_mul(gate_up), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(9, 3, 64), (32, 8, 128), (24, 1, 64)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_rope(backend, dtype, n_heads, n_kv_heads, head_dim, pos_dtype):
    dev, N, max_pos = backend.device, 5, 4100
    inv = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    cos, sin = ang.cos().float().to(dev), ang.sin().float().to(dev)
    positions = torch.tensor([4099, 0, 7, 7, 300], dtype=pos_dtype, device=dev)
    # q and k as views of one fused qkv row, the layout a projection produces: token stride > H * D
    qkv = randn(N, (n_heads + 2 * n_kv_heads) * head_dim, dtype=dtype, device=dev, seed=head_dim + n_heads)
    q = qkv[:, : n_heads * head_dim].view(N, n_heads, head_dim)
    k = qkv[:, n_heads * head_dim: (n_heads + n_kv_heads) * head_dim].view(N, n_kv_heads, head_dim)
    q_ref, k_ref = q.clone(), k.clone()
    ref.rope_(q_ref, k_ref, cos, sin, positions)
    v_before = qkv[:, (n_heads + n_kv_heads) * head_dim:].clone()
    backend.ops.rope_(q, k, cos, sin, positions)
    torch.testing.assert_close(q, q_ref, **tol(dtype))
    torch.testing.assert_close(k, k_ref, **tol(dtype))
    torch.testing.assert_close(qkv[:, (n_heads + n_kv_heads) * head_dim:], v_before, rtol=0, atol=0)


# --- decode attention ---------------------------------------------------------------------------------

ATTN_LENS = [[1], [255], [256], [257], [4097], [4097, 1, 300]]  # B = 1, and B = 3 with different lengths
CPU_ATTN_LENS = [[1], [255], [256], [257], [4097], [700, 1, 300]]
# (head_dim, H / Hkv): every heads-per-block instance (1, 2, 3, 4, 6, 8), and 12 = two head blocks of 6
ATTN_SHAPES = [(64, 1), (64, 2), (64, 3), (64, 8), (64, 12), (128, 1), (128, 3), (128, 4), (128, 6), (128, 8)]
CPU_ATTN_SHAPES = [(64, 3), (128, 1), (128, 8)]  # 2 and 4 heads per block: the plan and merge tests below


def attended(n: int, S: int, window: int, sinks: int) -> torch.Tensor:
    """[S] bool: the keys a row of length n attends."""
    j = torch.arange(S)
    live = j < n
    if window > 0:
        live &= (j < sinks) | (j >= n - window)
    return live


def attention_case(backend, dtype, head_dim, n_rep, lens, n_kv_heads=2, window=0, sinks=0):
    """q, k, v, seq_lens and the twin's answer; k and v hold NaN wherever a row attends nothing."""
    dev, B, S = backend.device, len(lens), max(lens) + 37  # S not a multiple of any tile
    H = n_rep * n_kv_heads
    q = randn(B, H, head_dim, dtype=dtype, device=dev, seed=S + H)
    k = randn(B, n_kv_heads, S, head_dim, dtype=dtype, device=dev, seed=S + 1)
    v = randn(B, n_kv_heads, S, head_dim, dtype=dtype, device=dev, seed=S + 2)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    k_twin, v_twin = k.clone(), v.clone()
    for b, n in enumerate(lens):
        masked = ~attended(n, S, window, sinks).to(dev)
        k[b, :, masked], v[b, :, masked] = NAN, NAN  # never read by the kernel
        k_twin[b, :, masked], v_twin[b, :, masked] = 0, 0
    want = ref.decode_attention(q, k_twin, v_twin, seq_lens, head_dim ** -0.5, window, sinks)
    return q, k, v, seq_lens, want


ATTN_CASES = [
    pytest.param(name, dtype, head_dim, n_rep, lens, id=f"{name}-{str(dtype)[6:]}-D{head_dim}-g{n_rep}-{lens}")
    for name, shapes, lens_list in [("cuda", ATTN_SHAPES, ATTN_LENS), ("emulated", CPU_ATTN_SHAPES, CPU_ATTN_LENS)]
    for dtype in DTYPES
    for head_dim, n_rep in shapes
    for lens in lens_list
    if not (name == "emulated" and lens == [4097] and (dtype != torch.bfloat16 or n_rep == 1))  # one long CPU case each
]


@pytest.mark.parametrize("backend,dtype,head_dim,n_rep,lens", ATTN_CASES, indirect=["backend"])
def test_decode_attention(backend, dtype, head_dim, n_rep, lens):
    q, k, v, seq_lens, want = attention_case(backend, dtype, head_dim, n_rep, lens)
    out = torch.full_like(q, NAN)
    assert backend.ops.decode_attention(q, k, v, seq_lens, head_dim ** -0.5, out=out) is out
    torch.testing.assert_close(out, want, **tol(dtype, fp32_rtol=1e-4))


# (window, sinks) and lengths around sinks + window: covered entirely, one key past it, far past it
WINDOW_CASES = [
    pytest.param(name, dtype, window, sinks, lens, id=f"{name}-{str(dtype)[6:]}-w{window}-s{sinks}-{lens}")
    for name, cases in [
        ("cuda", [(512, 4, [[1], [516], [517], [4097], [4097, 3, 600]]), (256, 0, [[256], [257], [4097]])]),
        ("emulated", [(100, 4, [[1], [104], [105], [700, 3, 300]]), (64, 0, [[64], [65], [700]]),
                      (1, 1, [[2], [300]])]),
    ]
    for dtype in DTYPES
    for window, sinks, lens_list in cases
    for lens in lens_list
]


@pytest.mark.parametrize("backend,dtype,window,sinks,lens", WINDOW_CASES, indirect=["backend"])
def test_decode_attention_window_and_sinks(backend, dtype, window, sinks, lens):
    """StreamingLLM: the sinks and the last `window` keys; the NaN-filled middle must never be read."""
    q, k, v, seq_lens, want = attention_case(backend, dtype, 128, 3, lens, window=window, sinks=sinks)
    out = torch.full_like(q, NAN)
    backend.ops.decode_attention(q, k, v, seq_lens, 128 ** -0.5, window, sinks, out=out)
    torch.testing.assert_close(out, want, **tol(dtype, fp32_rtol=1e-4))


@pytest.mark.parametrize("window,sinks", [(0, 0), (100, 4)])
def test_a_verify_pass_is_its_decode_steps_bit_for_bit(backend, window, sinks):
    """T queries per row (a verify pass) run the decode kernel's blocks on the splits planned for the batch: query
    t of a pass whose row ends at seq_len L is the decode step at length L - T + 1 + t, bit for bit (fp32, where
    any other order would show), and the pass is ref.attention's answer. q is a view into a wider row (the fused
    qkv output), so its token stride is not H * D; keys past L hold NaN and must not be read."""
    dev, B, T, Hkv, H, D = backend.device, 2, 5, 2, 6, 64
    lens = [700, T + 3]
    S = max(lens) + 37
    q = randn(B, T, H + 2 * Hkv, D, dtype=torch.float32, device=dev, seed=1)[:, :, :H]
    k = randn(B, Hkv, S, D, dtype=torch.float32, device=dev, seed=2)
    v = randn(B, Hkv, S, D, dtype=torch.float32, device=dev, seed=3)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    for b, n in enumerate(lens):
        k[b, :, n:], v[b, :, n:] = NAN, NAN
    out = backend.fused.attention(q, k, v, seq_lens, 0.125, window, sinks)
    want = ref.attention(q, k.nan_to_num(0.0), v.nan_to_num(0.0), seq_lens, 0.125, window, sinks)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for t in range(T):
        step = backend.fused.decode_attention(q[:, t], k, v, seq_lens - (T - 1 - t), 0.125, window, sinks)
        assert torch.equal(out[:, t], step), (t, (out[:, t] - step).abs().max().item())


def test_workspaces_are_kept_for_steps_and_verify_passes_only(backend):
    """A captured step or verify pass reads its workspace by address, so those stay; an eager catch-up may have
    any length, and keeping one workspace per length would grow without bound."""
    q = torch.zeros(1, cuda.GEMV_MAX_TOKENS + 1, 4, 64, device=backend.device)
    f = backend.fused
    assert f.attention_workspace(q[:, :1], 2)[0] is f.attention_workspace(q[:, 0], 2)[0]  # [B, 1, H, D] = [B, H, D]
    verify = q[:, :cuda.GEMV_MAX_TOKENS]
    assert f.attention_workspace(verify, 2)[0] is f.attention_workspace(verify, 2)[0]
    partials, counters = f.attention_workspace(q, 2)
    assert partials is not f.attention_workspace(q, 2)[0] and partials.shape[0] == counters.shape[0] == q.shape[1]


def test_one_plan_serves_every_length(backend):
    """A captured graph holds one launch planned for the cache's max: the same arguments (cache, workspace,
    seq_lens buffer) must serve a long step, then short ones, then long again, with or without a window.
    The merge counters are back at zero after every call."""
    q, k, v, seq_lens, _ = attention_case(backend, torch.float32, 64, 4, [2000])
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    partials, counters = backend.fused.attention_workspace(q, k.shape[1])
    out = torch.empty_like(q)
    for n, window, sinks in [(2000, 0, 0), (1, 0, 0), (300, 0, 0), (2000, 200, 4), (70, 64, 4), (2000, 0, 0)]:
        seq_lens.fill_(n)
        out.fill_(NAN)
        backend.ops.decode_attention(q, k, v, seq_lens, 0.125, window, sinks, out=out)
        torch.testing.assert_close(out, ref.decode_attention(q, k, v, seq_lens, 0.125, window, sinks),
                                   rtol=1e-4, atol=1e-5)
        assert torch.all(counters == 0), (n, counters)
    assert backend.fused.attention_workspace(q, k.shape[1])[0] is partials


@pytest.mark.parametrize("n,window,sinks", [(1, 0, 0), (63, 0, 0), (64, 0, 0), (129, 0, 0), (700, 0, 0),
                                            (700, 100, 4), (700, 600, 200)])
def test_splits_follow_the_mirrored_plan(backend, n, window, sinks):
    """The splits that write a partial row are exactly the ones cuda.active_splits predicts: the analysis in
    bench/attention.py describes the kernel that runs."""
    q, k, v, seq_lens, want = attention_case(backend, torch.bfloat16, 128, 1, [n], window=window, sinks=sinks)
    partials, counters = backend.fused.attention_workspace(q, k.shape[1])
    splits = partials.shape[2] - (counters.shape[2] - 1)
    partials.fill_(NAN)
    out = backend.ops.decode_attention(q, k, v, seq_lens, 128 ** -0.5, window, sinks)
    torch.testing.assert_close(out, want, **tol(torch.bfloat16))
    active, per_split = cuda.active_splits(cuda.live_keys(n, window, sinks), cuda.attention_tile_keys(128, q.dtype),
                                            splits)
    assert per_split % cuda.attention_tile_keys(128, q.dtype) == 0
    written = ~partials[0, 0, :splits, 0].isnan()
    assert written.tolist() == ([True] * active + [False] * (splits - active) if active > 1 else [False] * splits)


@pytest.mark.parametrize("backend", ["emulated"], indirect=True)
@pytest.mark.parametrize("lens", [[4097], [1000, 1, 300]])
def test_two_level_merge(backend, lens):
    """More splits than one merge level takes (a big GPU with few kv heads): the last split of each group
    merges the group, and the last group the groups."""
    wide = EmulatedModule(sm_count=24 * len(lens))  # 24 splits per (row, kv head), in 5 groups of 5
    f = cuda.CudaOps(wide)
    q, k, v, seq_lens, want = attention_case(backend, torch.float32, 64, 2, lens)
    want = ref.decode_attention(q, k.nan_to_num(0.0), v.nan_to_num(0.0), seq_lens, 0.125)
    partials, counters = f.attention_workspace(q, k.shape[1])
    assert partials.shape[2] == 24 + 5 and counters.shape[2] == 5 + 1
    partials.fill_(NAN)
    out = f.decode_attention(q, k, v, seq_lens, 0.125, out=torch.full_like(q, NAN))
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert torch.all(counters == 0)


def test_sliced_cache(backend):
    """The model passes k[layer][:, :, :kv_limit]: a view whose head stride is the full S_max."""
    q, k, v, seq_lens, _ = attention_case(backend, torch.bfloat16, 128, 3, [700, 1, 300])
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    kc, vc = k[:, :, :720], v[:, :, :720]
    assert not kc.is_contiguous()
    out = backend.ops.decode_attention(q, kc, vc, seq_lens, 0.1)
    torch.testing.assert_close(out, ref.decode_attention(q, kc, vc, seq_lens, 0.1), **tol(torch.bfloat16))


@pytest.mark.parametrize("backend", ["emulated"], indirect=True)
@pytest.mark.parametrize("eager_copies,reverse_threads,reverse_blocks",
                         [(False, True, False), (True, False, False), (True, True, True), (False, False, True)])
def test_decode_attention_under_other_schedules(backend, eager_copies, reverse_threads, reverse_blocks):
    """The CPU runtime can land async copies early or late, run threads in either order and run the grid
    from either end (so either end of a merge group arrives last): a missing wait, barrier or fence shows up
    under one schedule or another."""
    backend.module.set_schedule(eager_copies, reverse_threads, reverse_blocks)
    try:
        for head_dim, n_rep, window in [(64, 3, 0), (64, 9, 0), (128, 1, 0), (64, 3, 50)]:
            q, k, v, seq_lens, want = attention_case(backend, torch.float32, head_dim, n_rep, [300, 41],
                                                     window=window, sinks=2)
            out = backend.ops.decode_attention(q, k, v, seq_lens, head_dim ** -0.5, window, 2)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    finally:
        backend.module.set_schedule(False, False, False)


# --- CUDA only: the host code's checks and a clean build ----------------------------------------------


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_errors_name_the_values(backend):
    x = torch.randn(2, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"weight must be \[hidden\] = \[8\], got \[9\]"):
        backend.ops.rmsnorm(x, torch.ones(9, device="cuda"), 1e-5)
    q = torch.randn(1, 4, 96, device="cuda")
    cache = torch.randn(1, 2, 16, 96, device="cuda")
    with pytest.raises(RuntimeError, match="head_dim must be 64 or 128, got D = 96"):
        backend.ops.decode_attention(q, cache, cache, torch.ones(1, dtype=torch.int32, device="cuda"), 0.1)
    q, cache = q[..., :64].contiguous(), cache[..., :64].contiguous()
    with pytest.raises(RuntimeError, match="seq_lens must be int32"):
        backend.ops.decode_attention(q, cache, cache, torch.ones(1, dtype=torch.int64, device="cuda"), 0.1)
    with pytest.raises(RuntimeError, match="window and sinks must be >= 0, got window = -1, sinks = 4"):
        backend.ops.decode_attention(q, cache, cache, torch.ones(1, dtype=torch.int32, device="cuda"), 0.1, -1, 4)


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_extension_builds_from_a_clean_cache(backend, tmp_path):
    env = {**os.environ, "DECODESCOPE_EXT_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "engine.ops.ext", "build", "--target", "cuda"], capture_output=True,
                          text=True, env=env, cwd=Path(ext.__file__).resolve().parents[2])  # the repository
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fused CUDA kernels" in proc.stdout
    assert list(tmp_path.glob("*/decodescope_cuda_*.so"))
