"""The two backends the CUDA kernel tests run on (tests/test_kernels_cuda.py, tests/test_gemv_cuda.py).

"cuda" is the built extension (skipped with "needs a CUDA device"); "emulated" is the same kernel source compiled
by the host compiler against csrc/testing/cuda_on_cpu.h and called through ctypes, so CI without a GPU still
executes the kernels' indexing, barriers, shuffles, atomics and async-copy pipelines. The CPU backend runs
every CUDA thread as a coroutine, so its sweeps are smaller.
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
    """csrc/testing/<name>.cpp built once per test process (a session's test files share it)."""
    if shutil.which("c++") is None or cuda_include() is None:
        pytest.skip("the CPU backend needs a C++20 compiler and the CUDA toolkit headers (cuda_fp16.h)")
    lib = Path(tempfile.mkdtemp(prefix="decodescope-emulated-")) / f"{name}.so"
    # -ffp-contract=off: a product and a sum stay two roundings, as __fmul_rn / __fadd_rn are on the GPU
    cmd = ["c++", "-std=c++20", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-DDECODESCOPE_CUDA_ON_CPU",
           f"-I{cuda_include()}", str(ext.CSRC / "testing" / f"{name}.cpp"), "-o", str(lib)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cdll = ctypes.CDLL(str(lib))
    cdll.emu_last_error.restype = ctypes.c_char_p
    return cdll


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


class Emulated:
    """Calls emu_<name> of a library; a nonzero cudaError_t raises with what the CPU runtime reported."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def set_schedule(self, eager_copies: bool, reverse_threads: bool, reverse_blocks: bool = False) -> None:
        self.lib.emu_set_schedule(int(eager_copies), int(reverse_threads), int(reverse_blocks))

    def _call(self, name: str, *args) -> None:
        rc = getattr(self.lib, "emu_" + name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} failed ({rc}): {self.lib.emu_last_error().decode()}")


class Backend:
    """ops: the kernels' wrappers by op name; fused: the FusedOps behind them (its workspaces, the GEMV wrappers)."""

    def __init__(self, name: str, device: str, module):
        self.name, self.device, self.module = name, device, module
        self.fused = cuda.CudaOps(module)
        self.ops = SimpleNamespace(**self.fused.opset())


def make_backend(name: str, emulated_module) -> Backend:
    """The backend a module-scoped `backend` fixture returns; emulated_module() builds the CPU extension."""
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        status = ext.load("cuda")
        assert status.module is not None, f"the extension did not load: {status.reason}"
        return Backend("cuda", "cuda", status.module)
    return Backend("emulated", "cpu", emulated_module())
