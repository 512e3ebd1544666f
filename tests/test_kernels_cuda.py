"""Each fused kernel against its torch twin, through the wrappers in engine/ops/fused.py.

Two backends run the same cases: "cuda" (the built extension; skipped with "needs a CUDA device") and
"cpu", the same kernel source compiled by the host compiler against csrc/testing/cuda_on_cpu.h and run on
the CPU, so CI without a GPU still executes the kernels' indexing, barriers, shuffles and async-copy
pipeline. The CPU backend runs a smaller sweep (it runs every CUDA thread as a coroutine).

Outputs are poisoned with NaN before each launch, and so is every cache entry at or past seq_len (the
twin gets zeros there: it multiplies masked keys by 0, and 0 * NaN is NaN).

Tolerances, kernel vs twin (both compute in fp32 and round once):
  rmsnorm, silu_mul, rope: a different summation order, rsqrtf/expf and FMA contraction leave ~1e-6
      relative in fp32 -> fp32 rtol 1e-5; bf16/fp16 may round that to the neighbouring value: one ulp,
      rtol = finfo(dtype).eps, with atol 1e-5 for outputs near zero.
  add_rmsnorm's residual: the same fp32 sum rounded once, so exact.
  decode_attention: online softmax with exp2f and split merges over up to 4097 keys -> fp32 rtol 1e-4,
      atol 1e-5; bf16/fp16 one ulp as above.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine import ext
from engine.ops import fused, ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NAN = float("nan")


def tol(dtype: torch.dtype, fp32_rtol: float = 1e-5) -> dict:
    if dtype == torch.float32:
        return dict(rtol=fp32_rtol, atol=1e-5)
    return dict(rtol=torch.finfo(dtype).eps, atol=1e-5)


# --- the CPU backend ----------------------------------------------------------------------------------


def cuda_include() -> Path | None:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if shutil.which("nvcc"):
        homes.append(str(Path(shutil.which("nvcc")).resolve().parent.parent))
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda_fp16.h").exists():
            return Path(home) / "include"
    return None


class EmulatedExtension:
    """The extension's five functions, backed by csrc/testing/emulated_kernels.cpp through ctypes."""

    CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self.lib.emu_last_error.restype = ctypes.c_char_p

    def set_schedule(self, eager_copies: bool, reverse_order: bool) -> None:
        self.lib.emu_set_schedule(int(eager_copies), int(reverse_order))

    def _call(self, name: str, *args) -> None:
        rc = getattr(self.lib, "emu_" + name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed ({rc}): {self.lib.emu_last_error().decode()}")

    @staticmethod
    def _p(t: torch.Tensor) -> ctypes.c_void_p:
        return ctypes.c_void_p(t.data_ptr())

    def rmsnorm(self, out, x, weight, eps):
        hidden = x.shape[-1]
        self._call("rmsnorm", self.CODES[x.dtype], self._p(out), self._p(x), self._p(weight),
                   ctypes.c_int64(x.numel() // hidden), hidden, ctypes.c_float(eps))

    def add_rmsnorm(self, x, residual, weight, eps):
        hidden = x.shape[-1]
        self._call("add_rmsnorm", self.CODES[x.dtype], self._p(x), self._p(residual), self._p(weight),
                   ctypes.c_int64(x.numel() // hidden), hidden, ctypes.c_float(eps))

    def rope(self, q, k, cos, sin, positions):
        self._call("rope", self.CODES[q.dtype], positions.element_size(), self._p(q), self._p(k), self._p(cos),
                   self._p(sin), self._p(positions), ctypes.c_int64(q.shape[0]), q.shape[1], k.shape[1], q.shape[2],
                   ctypes.c_int64(q.stride(0)), ctypes.c_int64(k.stride(0)), ctypes.c_int64(cos.shape[0]))

    def silu_mul(self, out, gate_up):
        inter = out.shape[-1]
        self._call("silu_mul", self.CODES[out.dtype], self._p(out), self._p(gate_up),
                   ctypes.c_int64(out.numel() // inter), inter)

    def decode_attention(self, out, q, k_cache, v_cache, seq_lens, scale, partial_acc, partial_ml, chunk):
        B, H, D = q.shape
        ints = (ctypes.c_int * 7)(B, H, k_cache.shape[1], D, k_cache.shape[2], chunk, partial_acc.shape[2])
        strides = (ctypes.c_int64 * 5)(q.stride(0), q.stride(1), *k_cache.stride()[:3])
        self._call("decode_attention", self.CODES[q.dtype], self._p(out), self._p(q), self._p(k_cache),
                   self._p(v_cache), self._p(seq_lens), self._p(partial_acc), self._p(partial_ml), ints, strides,
                   ctypes.c_float(scale))


def build_emulator(out_dir: Path) -> Path:
    lib = out_dir / "emulated_kernels.so"
    cmd = ["c++", "-std=c++20", "-O2", "-shared", "-fPIC", "-DDECODESCOPE_CUDA_ON_CPU", f"-I{cuda_include()}",
           str(ext.CSRC / "testing" / "emulated_kernels.cpp"), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return lib


class Backend:
    def __init__(self, name: str, ops, device: str, module):
        self.name, self.ops, self.device, self.module = name, ops, device, module


@pytest.fixture(scope="session")
def emulated_extension(tmp_path_factory) -> EmulatedExtension:
    if shutil.which("c++") is None or cuda_include() is None:
        pytest.skip("the CPU backend needs a C++20 compiler and the CUDA toolkit headers (cuda_fp16.h)")
    return EmulatedExtension(build_emulator(tmp_path_factory.mktemp("emulated")))


@pytest.fixture(scope="module", params=["cuda", "cpu"])
def backend(request) -> Backend:
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        status = ext.load("cuda")
        assert status.module is not None, f"the extension did not load: {status.reason}"
        return Backend("cuda", SimpleNamespace(**fused.ops(status.module)), "cuda", status.module)
    module = request.getfixturevalue("emulated_extension")
    return Backend("cpu", SimpleNamespace(**fused.ops(module)), "cpu", module)


def randn(*shape, dtype, device, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)


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
CPU_ATTN_LENS = [[1], [255], [256], [257], [700, 1, 300]]
ATTN_SHAPES = [(64, 1), (64, 3), (64, 8), (128, 1), (128, 3), (128, 8)]  # (head_dim, H / Hkv)
CPU_ATTN_SHAPES = [(64, 3), (128, 1), (128, 8)]


def attention_case(backend, dtype, head_dim, n_rep, lens, n_kv_heads=2):
    dev, B, S = backend.device, len(lens), max(lens) + 37  # S not a multiple of any chunk
    H = n_rep * n_kv_heads
    q = randn(B, H, head_dim, dtype=dtype, device=dev, seed=S + H)
    k = randn(B, n_kv_heads, S, head_dim, dtype=dtype, device=dev, seed=S + 1)
    v = randn(B, n_kv_heads, S, head_dim, dtype=dtype, device=dev, seed=S + 2)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    k_twin, v_twin = k.clone(), v.clone()
    for b, n in enumerate(lens):
        k[b, :, n:], v[b, :, n:] = NAN, NAN  # never read by the kernel
        k_twin[b, :, n:], v_twin[b, :, n:] = 0, 0
    return q, k, v, seq_lens, ref.decode_attention(q, k_twin, v_twin, seq_lens, head_dim ** -0.5)


ATTN_CASES = [
    pytest.param(name, dtype, head_dim, n_rep, lens, id=f"{name}-{str(dtype)[6:]}-D{head_dim}-g{n_rep}-{lens}")
    for name, shapes, lens_list in [("cuda", ATTN_SHAPES, ATTN_LENS), ("cpu", CPU_ATTN_SHAPES, CPU_ATTN_LENS)]
    for dtype in DTYPES
    for head_dim, n_rep in shapes
    for lens in lens_list
]


@pytest.mark.parametrize("backend,dtype,head_dim,n_rep,lens", ATTN_CASES, indirect=["backend"])
def test_decode_attention(backend, dtype, head_dim, n_rep, lens):
    q, k, v, seq_lens, want = attention_case(backend, dtype, head_dim, n_rep, lens)
    out = torch.full_like(q, NAN)
    assert backend.ops.decode_attention(q, k, v, seq_lens, head_dim ** -0.5, out=out) is out
    torch.testing.assert_close(out, want, **tol(dtype, fp32_rtol=1e-4))


@pytest.mark.parametrize("chunk", [64, 128, 256])
def test_decode_attention_reads_only_live_splits(backend, chunk):
    """A long step fills many splits of the workspace; a shorter step after it must not read them."""
    q, k, v, seq_lens, _ = attention_case(backend, torch.float32, 64, 3, [700, 650])
    splits = -(-k.shape[2] // chunk)
    acc = torch.full((2, q.shape[1], splits, 64), NAN, device=backend.device)
    ml = torch.full((2, q.shape[1], splits, 2), NAN, device=backend.device)
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    for lens in ([700, 650], [129, 1], [700, 64]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out = torch.full_like(q, NAN)
        backend.module.decode_attention(out, q, k, v, seq_lens, 0.125, acc, ml, chunk)
        torch.testing.assert_close(out, ref.decode_attention(q, k, v, seq_lens, 0.125), rtol=1e-4, atol=1e-5)


def test_sliced_cache(backend):
    """The model passes k[layer][:, :, :kv_limit]: a view whose head stride is the full S_max."""
    q, k, v, seq_lens, _ = attention_case(backend, torch.bfloat16, 128, 3, [700, 1, 300])
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    kc, vc = k[:, :, :720], v[:, :, :720]
    assert not kc.is_contiguous()
    out = backend.ops.decode_attention(q, kc, vc, seq_lens, 0.1)
    torch.testing.assert_close(out, ref.decode_attention(q, kc, vc, seq_lens, 0.1), **tol(torch.bfloat16))


@pytest.mark.parametrize("backend", ["cpu"], indirect=True)
@pytest.mark.parametrize("eager_copies,reverse_order", [(False, True), (True, False), (True, True)])
def test_decode_attention_under_other_schedules(backend, eager_copies, reverse_order):
    """The CPU runtime can land async copies early or late and run threads in either order: a missing
    barrier or wait shows up under one schedule or another."""
    backend.module.set_schedule(eager_copies, reverse_order)
    try:
        for head_dim, n_rep in [(64, 3), (64, 9), (128, 1)]:
            q, k, v, seq_lens, want = attention_case(backend, torch.float32, head_dim, n_rep, [300, 41])
            out = backend.ops.decode_attention(q, k, v, seq_lens, head_dim ** -0.5)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    finally:
        backend.module.set_schedule(False, False)


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


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_extension_builds_from_a_clean_cache(backend, tmp_path):
    env = {**os.environ, "DECODESCOPE_EXT_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "engine.ext", "build", "--target", "cuda"], capture_output=True,
                          text=True, env=env,
                          cwd=Path(ext.__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fused CUDA kernels" in proc.stdout
    assert list(tmp_path.glob("*/decodescope_cuda_*.so"))
