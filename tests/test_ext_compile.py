"""The csrc/ sources compiled without a GPU: every kernel for sm_80 and sm_90 with nvcc alone (csrc/cuda/kernels.cu
is torch-free; ptxas reports each kernel's registers and spills, and none may spill), the torch-facing host files
against torch's headers, and every launcher the host code calls instantiated by the kernels' object."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

from engine.ops import ext
from nvcc import NVCC, NVCC_FLAGS, needs_nvcc, run

CXX = shutil.which("c++")


def cuda_include() -> Path | None:
    """The toolkit's headers (the CPU torch wheel knows no CUDA_HOME; nvcc on PATH may be a wrapper script)."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    if NVCC:
        homes.append(str(Path(NVCC).resolve().parent.parent))
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda_runtime_api.h").exists():
            return Path(home) / "include"
    return None


def host_compile_skip_reason() -> str | None:
    if CXX is None:
        return "needs a host C++ compiler (c++)"
    if cuda_include() is None:
        return "needs the CUDA toolkit headers (cuda_runtime_api.h under CUDA_HOME or /usr/local/cuda)"
    if not (Path(cpp_extension.include_paths()[0]) / "c10" / "cuda" / "CUDAGuard.h").exists():
        return f"this torch wheel ({torch.__version__}) ships no c10/cuda headers"
    return None


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every compile this module checks, run in parallel once: {label: (process, object file)}."""
    out = tmp_path_factory.mktemp("csrc_build")
    jobs = {}
    if NVCC:
        for arch in ("sm_80", "sm_90"):
            obj = out / f"kernels_{arch}.o"
            jobs[arch] = ([NVCC, *NVCC_FLAGS, f"-arch={arch}", "-Xptxas=-v", "-c",
                           str(ext.CSRC / "cuda" / "kernels.cu"), "-o", str(obj)], obj)
    if host_compile_skip_reason() is None:
        # The CPU wheel ships c10/cuda but not its build-generated cuda_cmake_macros.h; that header only sets
        # the Windows export macro, which C10_CUDA_NO_CMAKE_CONFIGURE_FILE lets us skip on Linux.
        includes = [*cpp_extension.include_paths(), str(cuda_include()), sysconfig.get_path("include")]
        flags = ["-std=c++17", "-fPIC", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-DTORCH_EXTENSION_NAME=decodescope_ops",
                 *(f"-isystem{p}" for p in includes), f"-I{ext.CSRC / 'cuda'}"]
        for name in ("ops", "ops_attention"):
            obj = out / f"{name}.o"
            jobs[name] = ([CXX, *flags, "-c", str(ext.CSRC / "cuda" / f"{name}.cpp"), "-o", str(obj)], obj)
        # bindings.cpp only registers; type-checking it is the point, code generation adds nothing.
        jobs["bindings"] = ([CXX, *flags, "-fsyntax-only", str(ext.CSRC / "cuda" / "bindings.cpp")], out / "none")
    with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
        futures = {label: pool.submit(run, cmd) for label, (cmd, _) in jobs.items()}
        return {label: (f.result(), jobs[label][1]) for label, f in futures.items()}


def assert_compiled(compiled, label: str) -> Path:
    proc, obj = compiled[label]
    assert proc.returncode == 0, f"{label} failed:\n{proc.stderr[-4000:]}"
    return obj


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_with_nvcc_alone(compiled, arch):
    assert_compiled(compiled, arch)


# ptxas -v, per entry function: its name, then its stack frame and spills, then its registers.
PTXAS_ENTRY = re.compile(
    r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\d+)'\n"
    r"ptxas info\s*: Function properties for (?P=name)\n"
    r"\s*(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads\n"
    r"ptxas info\s*: Used (?P<registers>\d+) registers")


def ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """{mangled kernel name: {stack, stores, loads, registers}} from nvcc -Xptxas=-v output."""
    return {m["name"]: {k: int(m[k]) for k in ("stack", "stores", "loads", "registers")}
            for m in PTXAS_ENTRY.finditer(text)}


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_no_kernel_spills(compiled, arch):
    """Every kernel keeps its state in registers: 0 bytes spill stores (and loads, and stack) per ptxas."""
    assert_compiled(compiled, arch)
    text = compiled[arch][0].stderr
    report = ptxas_report(text)
    assert len(report) == text.count("Compiling entry function") > 0, text[-2000:]
    assert any("decode_kernel" in name for name in report) and any("gemv" in name for name in report)
    spilled = {name: r for name, r in report.items() if r["stores"] or r["loads"] or r["stack"]}
    assert not spilled, spilled


def launcher_symbols(obj: Path, defined: bool) -> set[str]:
    flag = "--defined-only" if defined else "--undefined-only"
    lines = run(["nm", "-C", flag, str(obj)]).stdout.splitlines()
    return {m[0] for ln in lines if (m := re.search(r"decodescope::(launch|plan)_.*", ln))}


@pytest.mark.skipif(host_compile_skip_reason() is not None, reason=str(host_compile_skip_reason()))
@pytest.mark.parametrize("name", ["ops", "ops_attention", "bindings"])
def test_host_code_compiles_against_torch_headers(compiled, name):
    assert_compiled(compiled, name)


@needs_nvcc
@pytest.mark.skipif(host_compile_skip_reason() is not None, reason=str(host_compile_skip_reason()))
@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm to read symbol tables")
def test_every_launcher_the_host_code_calls_is_instantiated(compiled):
    defined = launcher_symbols(assert_compiled(compiled, "sm_80"), defined=True)
    needed = set()
    for name in ("ops", "ops_attention"):
        needed |= launcher_symbols(assert_compiled(compiled, name), defined=False)
    # 3 dtypes x (rmsnorm, add_rmsnorm, 2 rope position types, silu_mul, attention, its plan, int8, q4, fp16 and
    # bf16 GEMV, int8 and q4 dequantize)
    assert len(needed) == 39
    assert needed <= defined, sorted(needed - defined)
