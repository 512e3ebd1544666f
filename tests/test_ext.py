"""engine/ops/ext.py without a GPU: the arch list and build folder, a finished build loaded without the build
machinery, and a missing device, DECODESCOPE_NO_EXT=1, a CPU-only torch and a failing build all falling back to the
torch twins with the reason recorded. The sources' own compiles: tests/test_ext_compile.py.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine import ops
from engine.ops import ext
from engine.ops import cuda, ref
from nvcc import NVCC, NVCC_FLAGS, needs_nvcc, run


# --- arch list, cache key, error text ------------------------------------------------------------------


def test_arch_list_and_gencode(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 9.0+PTX")
    assert ext.arch_list() == ["8.0", "9.0+PTX"]
    assert ext.gencode_flags(["8.0", "9.0+PTX"]) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ext.arch_list() == list(ext.DEFAULT_ARCHS)


def test_build_dir_is_keyed_by_arch_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_EXT_CACHE", str(tmp_path / "ext"))
    src = tmp_path / "csrc"
    shutil.copytree(ext.CSRC, src)
    a = ext.build_dir("cuda", ["9.0"], src)
    assert a.parent == tmp_path / "ext" and a.name.startswith("sm90-")
    assert ext.build_dir("cuda", ["8.0", "9.0"], src).name.startswith("sm80_sm90-")
    assert ext.build_dir("cuda", ["9.0"], src) == a
    (src / "cuda" / "rope.cuh").write_text((src / "cuda" / "rope.cuh").read_text() + "\n// edited\n")
    assert ext.build_dir("cuda", ["9.0"], src) != a


@pytest.mark.parametrize("entry", ["Hopper", "9", "7.0", "6.1+PTX"])
def test_arch_list_rejects_what_nvcc_13_would(monkeypatch, entry):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", f"8.0;{entry}")
    with pytest.raises(ext.ArchListError, match=re.escape(repr(entry))):
        ext.arch_list()


def test_bad_arch_list_is_a_reason_not_a_build(monkeypatch, tmp_path):
    monkeypatch.setenv("DECODESCOPE_EXT_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")
    monkeypatch.setattr(ext, "toolkit_problem", lambda target: None)
    monkeypatch.setattr(ext, "_compile", lambda *a: pytest.fail("no compile with a bad arch list"))
    status = ext.build("cuda")
    assert status.module is None and "'Hopper'" in status.reason


def test_a_stale_torch_lock_is_removed_under_our_lock(monkeypatch, tmp_path):
    """A build killed mid-way leaves cpp_extension's `lock` file behind; its next load would wait forever."""
    monkeypatch.setenv("DECODESCOPE_EXT_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setattr(ext, "toolkit_problem", lambda target: None)
    directory = ext.build_dir("cuda", ["8.0"], ext.CSRC)
    directory.mkdir(parents=True)
    (directory / "lock").write_text("")
    seen = []

    def compile_(target, name, d, archs, csrc, verbose):
        seen.append((d / "lock").exists())
        raise RuntimeError("Error building extension 'x': stop here")

    monkeypatch.setattr(ext, "_compile", compile_)
    assert ext.build("cuda").module is None
    assert seen == [False]


def test_a_finished_build_loads_without_the_build_machinery():
    """cpp_extension (setuptools with it: ~5 MB of every CPU process's RSS) only where a build runs."""
    if ext.load("cpu").module is None:
        pytest.skip(f"the CPU kernels did not build: {ext.load('cpu').reason}")
    code = ("import sys; from engine.ops import ext; assert ext.load('cpu').module is not None; "
            "print('torch.utils.cpp_extension' in sys.modules, 'setuptools' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[1])
    assert done.stdout.split() == ["False", "False"]


def test_a_module_that_does_not_load_is_built_again(monkeypatch, tmp_path):
    """A link cut short leaves a file of the module's name behind: it is rebuilt, not reported as the build."""
    monkeypatch.setenv("DECODESCOPE_EXT_CACHE", str(tmp_path))
    monkeypatch.setattr(ext, "toolkit_problem", lambda target: None)
    directory = ext.build_dir("cpu", [], ext.CSRC)
    directory.mkdir(parents=True)
    name = "decodescope_cpu_" + directory.name.rsplit("-", 1)[1]
    (directory / f"{name}.so").write_bytes(b"\x7fELF cut short")
    compiled = []
    monkeypatch.setattr(ext, "_compile", lambda *a: compiled.append(a[1]) or SimpleNamespace(isa=lambda: "avx2"))
    assert ext.build("cpu").module is not None
    assert compiled == [name]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_build_leaves_the_flags_it_hashes_as_they_were(monkeypatch, target):
    """cpp_extension.load appends torch's libraries to the lists it is given: given ours, the next load in the
    process hashed other flags, built the module again into a new folder and failed to import it twice."""
    from torch.utils import cpp_extension

    def load(**kw):
        for key in ("extra_cflags", "extra_ldflags", "extra_cuda_cflags"):
            if key in kw:
                kw[key].append("-ltorch_cpu")
        return SimpleNamespace()

    before = ext.build_dir(target, ["9.0"], ext.CSRC)
    monkeypatch.setattr(cpp_extension, "load", load)
    ext._compile(target, "m", before, ["9.0"], ext.CSRC, False)
    assert ext.build_dir(target, ["9.0"], ext.CSRC) == before


def test_missing_sources_are_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(ext, "toolkit_problem", lambda target: None)
    status = ext.build("cuda", csrc=tmp_path)
    assert status.module is None and "sources are missing" in status.reason


def test_compiler_error_keeps_the_error_lines():
    text = "Error building extension 'x': [1/4] nvcc ...\nFAILED: kernels.o\nnote: blah\nkernels.cu(3): error: bad\n"
    assert ext.compiler_error(text) == "kernels.cu(3): error: bad"
    assert ext.compiler_error("Error building extension 'x': a.cu(1): error: first\nb") == "a.cu(1): error: first"
    assert ext.compiler_error("a\nb\nc", max_lines=2) == "b\nc"


def test_active_splits_cover_the_live_keys():
    """The mirror of the kernel's device-side plan (tests/test_kernels_cuda.py checks it against the kernel):
    whole tiles per split, at least two of them, every live key covered by exactly the active splits."""
    tile = cuda.attention_tile_keys(128, torch.bfloat16)
    assert tile == 32
    assert cuda.active_splits(1000, tile, 49) == (16, 64)  # short: fewer, still whole-pipeline splits
    assert cuda.active_splits(32768, tile, 49) == (49, 672)  # long: every split of the wave
    for n, splits in [(1, 8), (63, 8), (64, 8), (65, 8), (4097, 8), (4097, 256), (100000, 256)]:
        active, per = cuda.active_splits(n, tile, splits)
        assert 1 <= active <= splits and per % tile == 0
        assert per * (active - 1) < n <= per * active
        assert active == 1 or per >= cuda.ATTN_MIN_TILES_PER_SPLIT * tile
    assert cuda.live_keys(4097, 512, 4) == 516 and cuda.live_keys(516, 512, 4) == 516
    assert cuda.live_keys(300, 0, 4) == 300


# --- fallbacks -----------------------------------------------------------------------------------------


@pytest.fixture
def fresh_load(monkeypatch, tmp_path):
    """ext.load() un-memoized, caching into tmp_path, pretending a CUDA device is visible."""
    monkeypatch.setenv("DECODESCOPE_EXT_CACHE", str(tmp_path / "ext"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.delenv("DECODESCOPE_NO_EXT", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ext.load.cache_clear()
    yield
    ext.load.cache_clear()


def assert_twins(opset, reason_part: str):
    assert opset.name == "torch"
    assert reason_part in opset.reason
    assert opset.rmsnorm is ref.rmsnorm and opset.attention is ref.attention


def test_cpu_runs_the_twins_with_the_reason_when_its_kernels_cannot(monkeypatch):
    monkeypatch.setattr(ext, "load", lambda target: ext.ExtStatus(None, f"no {target} kernels here: a test says so"))
    assert_twins(ops.select("cpu"), "no cpu kernels here")
    assert_twins(ops.select("cpu", fused=False), "switched off")


def test_unsupported_head_dim_runs_the_twins_before_any_build(monkeypatch):
    monkeypatch.setattr(ext, "load", lambda target: pytest.fail("no build for a head_dim the kernel lacks"))
    assert_twins(ops.select("cuda", head_dim=80), "this model has 80")


def test_no_device_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DECODESCOPE_NO_EXT", raising=False)
    ext.load.cache_clear()
    try:
        status = ext.load("cuda")
        assert status.module is None and status.reason == "no CUDA device"
    finally:
        ext.load.cache_clear()


def test_no_ext_env_runs_the_twins(fresh_load, monkeypatch):
    monkeypatch.setenv("DECODESCOPE_NO_EXT", "1")
    assert_twins(ops.select("cuda"), "DECODESCOPE_NO_EXT=1")


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the report of a CPU-only torch build")
def test_cpu_torch_reports_instead_of_building(fresh_load):
    status = ext.build("cuda")
    assert status.module is None and "CPU build" in status.reason and "torch.version.cuda is None" in status.reason
    assert_twins(ops.select("cuda"), "CPU build")
    proc = run([sys.executable, "-m", "engine.ops.ext", "build", "--target", "cuda"])
    assert proc.returncode == 1 and "CPU build" in proc.stdout


@needs_nvcc
def test_failing_build_runs_the_twins_with_the_compiler_error(fresh_load, monkeypatch, tmp_path):
    broken = tmp_path / "broken_csrc"
    shutil.copytree(ext.CSRC, broken)
    path = broken / "cuda" / "decode_attention.cuh"
    path.write_text(path.read_text().replace("const float rescale", "const flaot rescale"))
    calls = []

    def nvcc_as_cpp_extension_would(target, name, directory, archs, csrc, verbose):
        # cpp_extension.load needs a CUDA torch; compile the real (broken) sources the same way and raise
        # what it raises: RuntimeError("Error building extension ...") with the compiler's output.
        calls.append((name, directory, archs, csrc))
        proc = run([NVCC, *NVCC_FLAGS, "-arch=sm_80", "-c", str(csrc / "cuda" / "kernels.cu"), "-o",
                    str(tmp_path / "k.o")])
        raise RuntimeError(f"Error building extension '{name}': {proc.stdout}{proc.stderr}")

    monkeypatch.setattr(ext, "toolkit_problem", lambda target: None)
    monkeypatch.setattr(ext, "_compile", nvcc_as_cpp_extension_would)
    monkeypatch.setattr(ext, "CSRC", broken)
    opset = ops.select("cuda")
    assert_twins(opset, "CUDA kernel build failed")
    assert "decode_attention.cuh" in opset.reason and 'identifier "flaot" is undefined' in opset.reason
    (name, directory, archs, csrc), = calls
    assert csrc == broken and archs == ["8.0"] and directory.parent == tmp_path / "ext"
    assert name.startswith("decodescope_cuda_") and (directory / "build.lock").exists()


@pytest.mark.skipif(shutil.which("c++") is None or os.environ.get("DECODESCOPE_NO_EXT") == "1",
                    reason="needs a host C++ compiler and the kernels switched on")
def test_the_cpu_kernels_build_wherever_a_compiler_is():
    """Every CPU kernel test skips when the module cannot build, so a header that moved away would pass the suite
    on the twins alone: this one fails instead, with the compiler's own words."""
    status = ext.load("cpu")
    assert status.module is not None, status.reason


# --- the module's C++ runtime ---------------------------------------------------------------------------


def archive_only_folder(tmp_path: Path) -> str:
    """A folder holding libstdc++.a and no shared libstdc++, as the H200 image's /opt/gcc/lib/gcc/.../13/ is."""
    folder = tmp_path / "gcc-lib"
    folder.mkdir()
    archive = subprocess.run(["g++", "-print-file-name=libstdc++.a"], capture_output=True, text=True).stdout.strip()
    if not Path(archive).is_file():
        pytest.skip("this g++ has no static libstdc++.a")
    (folder / "libstdc++.a").symlink_to(archive)
    return f"-B{folder}/"


@pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux"),
                    reason="needs g++ on PATH, on Linux")
@pytest.mark.parametrize("wrapper_flag", ["-static-libstdc++", "archive-only -B folder"])
def test_a_compiler_that_links_its_own_cpp_runtime_still_formats_numbers(tmp_path, wrapper_flag):
    """A CXX that links libstdc++.a into the module (the H200 image's wrapper passes -B to a folder holding only
    the archive; -static-libstdc++ does the same) gave it a second C++ runtime: its TORCH_CHECK messages lost every
    number, and on that GPU machine the process crashed. Built with the link flags ext.py passes, the module uses
    torch's runtime and the message names the size."""
    flag = archive_only_folder(tmp_path) if wrapper_flag.startswith("archive") else wrapper_flag
    wrapper = tmp_path / "g++"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("g++")} {flag} "$@"\n')
    wrapper.chmod(0o755)
    source = tmp_path / "check.cpp"
    source.write_text('#include <torch/python.h>\n'
                      'void check(const at::Tensor& t) { TORCH_CHECK(false, "got ", t.sizes(), " and ", 7); }\n'
                      'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("check", &check); }\n')
    script = ("import torch; from torch.utils import cpp_extension; from engine.ops import ext\n"
              f"m = cpp_extension.load(name='runtime_check', sources=[{str(source)!r}], build_directory="
              f"{str(tmp_path)!r}, extra_ldflags=list(ext.LINK_FLAGS))\n"
              "try:\n    m.check(torch.zeros(2, 3))\nexcept RuntimeError as e:\n    print(str(e).splitlines()[0])\n")
    env = {**os.environ, "CXX": str(wrapper)}
    repo = Path(ext.__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=repo)
    assert proc.returncode == 0 and proc.stdout.strip() == "got [2, 3] and 7", proc.stdout + proc.stderr[-2000:]
