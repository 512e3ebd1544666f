"""The two backends the CUDA kernel tests run on (tests/test_kernels_cuda.py, tests/test_gemv_cuda.py).

"cuda" is the built extension (skipped with "needs a CUDA device"); "emulated" is the same kernel source compiled
by the host compiler against csrc/cuda/testing/cuda_on_cpu.h and called through ctypes, so CI without a GPU still
executes the kernels' indexing, barriers, shuffles, atomics and async-copy pipelines. The CPU backend runs
every CUDA thread as a coroutine, so its sweeps are smaller. EmulatedModule has the extension's functions with its
signatures, so engine.ops.cuda_ops builds a model's whole CUDA path over it on a CPU.
"""
from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.ops import ext
from engine.ops import cuda

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NAN = float("nan")
CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def tol(dtype: torch.dtype, fp32_rtol: float = 1e-5) -> dict:
    """fp32: the given rtol; bf16/fp16 round an fp32 result that differs in its last bits: one ulp."""
    if dtype == torch.float32:
        return dict(rtol=fp32_rtol, atol=1e-5)
    return dict(rtol=torch.finfo(dtype).eps, atol=1e-5)


def randn(*shape, dtype, device, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)


def cuda_include() -> Path | None:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if shutil.which("nvcc"):
        homes.append(str(Path(shutil.which("nvcc")).resolve().parent.parent))
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda_fp16.h").exists():
            return Path(home) / "include"
    return None


@functools.cache
def emulated_library(name: str) -> ctypes.CDLL:
    """csrc/cuda/testing/<name>.cpp built once per test process (a session's test files share it)."""
    if shutil.which("c++") is None or cuda_include() is None:
        pytest.skip("the CPU backend needs a C++20 compiler and the CUDA toolkit headers (cuda_fp16.h)")
    lib = Path(tempfile.mkdtemp(prefix="decodescope-emulated-")) / f"{name}.so"
    # -ffp-contract=off: a product and a sum stay two roundings, as __fmul_rn / __fadd_rn are on the GPU
    cmd = ["c++", "-std=c++20", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-DDECODESCOPE_CUDA_ON_CPU",
           f"-I{cuda_include()}", str(ext.CSRC / "cuda" / "testing" / f"{name}.cpp"), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cdll = ctypes.CDLL(str(lib))
    cdll.emu_last_error.restype = ctypes.c_char_p
    return cdll


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


EMULATED_SMS = 8  # with 2 blocks per SM: 16 blocks a wave, e.g. 8 splits for B = 1, Hkv = 2


class EmulatedModule:
    """The extension's functions (csrc/cuda/bindings.cpp) with its signatures, backed by
    csrc/cuda/testing/emulated_kernels.cpp and emulated_gemv.cpp; a nonzero cudaError_t raises with what the CPU
    runtime reported."""

    def __init__(self, sm_count: int = EMULATED_SMS):
        self.libs = [emulated_library("emulated_kernels"), emulated_library("emulated_gemv")]
        self.sm_count = sm_count

    def set_schedule(self, eager_copies: bool, reverse_threads: bool, reverse_blocks: bool = False) -> None:
        for lib in self.libs:
            lib.emu_set_schedule(int(eager_copies), int(reverse_threads), int(reverse_blocks))

    def _call(self, name: str, *args) -> None:
        lib = next(lib for lib in self.libs if hasattr(lib, "emu_" + name))
        rc = getattr(lib, "emu_" + name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed ({rc}): {lib.emu_last_error().decode()}")

    # --- csrc/cuda/norm.cuh, rope.cuh, activation.cuh, decode_attention.cuh ---

    def rmsnorm(self, out, x, weight, eps):
        hidden = x.shape[-1]
        self._call("rmsnorm", CODES[x.dtype], ptr(out), ptr(x), ptr(weight), ctypes.c_int64(x.numel() // hidden),
                   hidden, ctypes.c_float(eps))

    def add_rmsnorm(self, x, residual, weight, eps):
        hidden = x.shape[-1]
        self._call("add_rmsnorm", CODES[x.dtype], ptr(x), ptr(residual), ptr(weight),
                   ctypes.c_int64(x.numel() // hidden), hidden, ctypes.c_float(eps))

    def rope(self, q, k, cos, sin, positions):
        self._call("rope", CODES[q.dtype], positions.element_size(), ptr(q), ptr(k), ptr(cos), ptr(sin),
                   ptr(positions), ctypes.c_int64(q.shape[0]), q.shape[1], k.shape[1], q.shape[2],
                   ctypes.c_int64(q.stride(0)), ctypes.c_int64(k.stride(0)), ctypes.c_int64(cos.shape[0]))

    def silu_mul(self, out, gate_up):
        inter = out.shape[-1]
        self._call("silu_mul", CODES[out.dtype], ptr(out), ptr(gate_up), ctypes.c_int64(out.numel() // inter), inter)

    def decode_attention(self, out, q, k_cache, v_cache, seq_lens, scale, window, sinks, partials, counters):
        B, T, H, D = q.shape
        groups = counters.shape[2] - 1
        ints = (ctypes.c_int * 10)(B, T, H, k_cache.shape[1], D, k_cache.shape[2], window, sinks,
                                   partials.shape[2] - groups, groups)
        strides = (ctypes.c_int64 * 6)(*q.stride()[:3], *k_cache.stride()[:3])
        self._call("decode_attention", CODES[q.dtype], ptr(out), ptr(q), ptr(k_cache), ptr(v_cache), ptr(seq_lens),
                   ptr(partials), ptr(counters), ints, strides, ctypes.c_float(scale))

    def decode_attention_plan(self, q, n_kv_heads):
        plan = (ctypes.c_int * 3)()
        self._call("decode_attention_plan", CODES[q.dtype], q.shape[0], q.shape[1], n_kv_heads, q.shape[2],
                   self.sm_count, plan)
        return plan[0], plan[1], plan[2]

    def format_facts(self) -> dict[str, dict]:
        """The rows of csrc/format_list.h a CUDA kernel reads, as the extension reports them."""
        lib, facts = self.libs[1], {}
        name, bits, block = ctypes.c_char_p(), ctypes.c_double(), ctypes.c_int()
        while lib.emu_format(len(facts), ctypes.byref(name), ctypes.byref(bits), ctypes.byref(block)):
            facts[name.value.decode()] = dict(bits=bits.value, block=block.value)
        return facts

    # --- csrc/cuda/gemv.cuh and dequantize.cuh ---

    WEIGHT_CODES = {torch.int8: 0, torch.uint8: 1, torch.float16: 2, torch.bfloat16: 3}  # emulated_gemv.cpp

    def _linear(self, out, x, qs, d=None, m=None):
        ints = (ctypes.c_int * 3)(x.shape[0], x.shape[1], qs.shape[0])
        self._call("linear", self.WEIGHT_CODES[qs.dtype], CODES[x.dtype], ptr(out), ptr(x), ptr(qs),
                   None if d is None else ptr(d), None if m is None else ptr(m), ints, ctypes.c_int64(x.stride(0)))

    def linear_int8(self, out, x, qs, d):
        self._linear(out, x, qs, d)

    def linear_q4(self, out, x, qs, d, m):
        self._linear(out, x, qs, d, m)

    def linear_dense(self, out, x, w):
        self._linear(out, x, w)

    def _dequantize(self, q4: bool, out, qs, d, m):
        ints = (ctypes.c_int * 2)(out.shape[0], out.shape[1])
        self._call("dequantize", int(q4), CODES[out.dtype], ptr(out), ptr(qs), ptr(d), None if m is None else ptr(m),
                   ints, ctypes.c_int64(out.stride(0)))

    def dequantize_int8(self, out, qs, d):
        self._dequantize(False, out, qs, d, None)

    def dequantize_q4(self, out, qs, d, m):
        self._dequantize(True, out, qs, d, m)


class Backend:
    """ops: the kernels' wrappers by op name; fused: the FusedOps behind them (its workspaces, the GEMV wrappers)."""

    def __init__(self, name: str, device: str, module):
        self.name, self.device, self.module = name, device, module
        self.fused = cuda.CudaOps(module)
        self.ops = SimpleNamespace(**self.fused.opset())


def make_backend(name: str) -> Backend:
    """The backend a module-scoped `backend` fixture returns."""
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        status = ext.load("cuda")
        assert status.module is not None, f"the extension did not load: {status.reason}"
        return Backend("cuda", "cuda", status.module)
    return Backend("emulated", "cpu", EmulatedModule())
