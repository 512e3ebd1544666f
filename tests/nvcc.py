"""nvcc on PATH, the flags torch's extension builds pass it, and the marker of a test that needs it
(tests/test_ext.py, tests/test_ext_compile.py)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from torch.utils import cpp_extension

NVCC = shutil.which("nvcc")
# The defines torch's extension builds pass to nvcc (no implicit half/bfloat16 conversions): the kernels
# must compile under them, so the tests use the same list.
NVCC_FLAGS = ["-std=c++17", "-O3", *cpp_extension.COMMON_NVCC_FLAGS]


def needs_nvcc(test):
    return pytest.mark.nvcc(pytest.mark.skipif(NVCC is None, reason="needs nvcc on PATH")(test))


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)
