"""The CPU kernel module on each instruction-set path, for the tests of csrc/cpu/ (tests/test_kernels_cpu*.py,
whose fixtures `cpu_module` and `m` are these in tests/conftest.py): the module (or a skip saying why not), the
module switched to one path, and a loop over the paths. amx runs with its tiles forced on at every row count, so
the tiles meet every row count the tests sweep."""
from __future__ import annotations

import shutil

import pytest
import torch

from engine import weights as W
from engine.observe.provenance import cpu_info
from engine.ops import ext

NAN = float("nan")
KERNEL_FORMATS = W.PANEL_FORMATS  # every format with a CPU kernel, q8 (a q4 model's head) included
K_QUANTS = [f for f in KERNEL_FORMATS if W.get(f).cpu_activations == "q8_k"]


def linear(m, fmt: str, out: torch.Tensor, x: torch.Tensor, *tensors: torch.Tensor) -> None:
    """The module's one linear, for the format named as engine/weights names it."""
    m.linear(out, x, m.formats().index(fmt), list(tensors))


def needs_vnni_and(compiler: str):
    """A skip mark for the benches that compile their own loops (bench.ports, tile_pace, vcpus, verify_pace): the
    CPU's flags as provenance reads them."""
    has_vnni = "avx512_vnni" in cpu_info()["cpu_flags"].split()
    return pytest.mark.skipif(not has_vnni or shutil.which(compiler) is None,
                              reason=f"needs AVX-512 VNNI and {compiler}")


def load_module():
    status = ext.load("cpu")
    if status.module is None:
        pytest.skip(f"the CPU kernels did not build: {status.reason}")
    return status.module


PATHS = ["avx2", "avx512", "amx"]


def best_path(module) -> str:
    return module.isa().split()[0]


def on_path(module, name: str):
    """A fixture's body: the module switched to one path (skipped where this CPU lacks it), then restored."""
    best, rows = best_path(module), module.amx_rows()
    try:
        module.set_isa(name)
    except RuntimeError as e:
        pytest.skip(str(e))
    module.set_amx_rows(1)
    yield module
    module.set_isa(best)
    module.set_amx_rows(rows)


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


def assert_within(out: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """No NaN in `out`, and |out - want| <= bound everywhere."""
    excess = (out - want).abs() - bound
    assert not out.isnan().any(), f"{what}: NaN in the output"
    assert excess.max() <= 0, f"{what}: |out - twin| exceeds the bound by {excess.max():.3g}"
