"""The int8 and q4 GEMV kernels (csrc/gemv.cuh) against their twin, ref.linear(x, weights.dequantize(blocks)),
through the wrappers in engine/ops/cuda.py, on both backends of tests/cuda_backends.py.

Outputs are poisoned with NaN before each launch. Sizes are awkward on purpose: 1 and 17 output rows (a
block's rows mostly idle), 769 (not a multiple of any block's rows), inputs 32 (one quantization block), 96
(a chunk's lanes mostly idle) and 576 (two chunks, the second partial), T 1, 6 and 16 (token tiles 1, 8, 16).

Tolerance: kernel and twin accumulate in fp32 and round once, but the kernel takes the block's scale (and min)
out of the block's sum and adds in another order. fp32 rounding over `in` terms stays far below
1e-5 * sum_i |w_i x_i| (the worst case is in * 2^-24 of it; a random order gives about sqrt(in) * 2^-24),
plus one ulp of the output dtype where bf16/fp16 round that sum.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

from cuda_backends import CODES, DTYPES, NAN, Emulated, emulated_library, make_backend, ptr, randn
from engine import weights
from engine.ops import ref


class EmulatedGemv(Emulated):
    """linear_int8 / linear_q4 with the extension's signatures, backed by csrc/testing/emulated_gemv.cpp."""

    def __init__(self):
        super().__init__(emulated_library("emulated_gemv"))

    def _linear(self, q4: bool, out, x, qs, d, m):
        ints = (ctypes.c_int * 3)(x.shape[0], x.shape[1], qs.shape[0])
        self._call("linear", int(q4), CODES[x.dtype], ptr(out), ptr(x), ptr(qs), ptr(d),
                   None if m is None else ptr(m), ints, ctypes.c_int64(x.stride(0)))

    def linear_int8(self, out, x, qs, d):
        self._linear(False, out, x, qs, d, None)

    def linear_q4(self, out, x, qs, d, m):
        self._linear(True, out, x, qs, d, m)


@pytest.fixture(scope="module", params=["cuda", pytest.param("emulated", marks=pytest.mark.emulation)])
def backend(request):
    return make_backend(request.param, EmulatedGemv)


def quantized(fmt: str, out_features: int, in_features: int, device: str, seed: int = 0):
    """(Blocks, the kernel's arguments): int8 (qs, d); q4 (packed qs, d, m)."""
    w = randn(out_features, in_features, dtype=torch.float32, device="cpu", scale=0.05, seed=seed)
    w[out_features // 2] += 0.3  # a row whose min is far from zero: q4's m term matters
    b = weights.quantize(w, fmt)
    q = b.q if fmt == "int8" else weights.pack_nibbles(b.q)
    args = (q, b.d) if fmt == "int8" else (q, b.d, b.m)
    return b, tuple(t.to(device) for t in args)


def run(backend, fmt: str, x: torch.Tensor, args, out=None):
    linear = backend.fused.linear_int8 if fmt == "int8" else backend.fused.linear_q4
    return linear(x, *args, out=out)


def assert_matches_twin(out: torch.Tensor, x: torch.Tensor, b: weights.Blocks) -> None:
    w = weights.dequantize(b).to(x.device)
    want = ref.linear(x, w)
    magnitude = x.float().abs() @ w.abs().t()  # sum_i |w_i x_i| per output
    bound = 1e-5 * magnitude + (0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps) * want.float().abs()
    err = (out.float() - want.float()).abs()
    assert not out.isnan().any(), "an output was never written"
    worst = (err - bound).argmax()
    assert torch.all(err <= bound + 1e-7), (
        f"error {err.flatten()[worst]:.3g} over the bound {bound.flatten()[worst]:.3g}")


SIZES = [(o, i) for o in (1, 17, 769) for i in (32, 96, 576)]
CPU_SIZES = [(1, 576), (17, 96), (769, 32), (17, 576)]
CASES = [
    pytest.param(name, fmt, dtype, o, i, T, id=f"{name}-{fmt}-{str(dtype)[6:]}-o{o}-i{i}-T{T}")
    for name, sizes in [("cuda", SIZES), ("emulated", CPU_SIZES)]
    for fmt in ("int8", "q4")
    for dtype in DTYPES
    for o, i in sizes
    for T in (1, 6, 16)
    if name == "cuda" or (o, T) != (769, 16) or dtype == torch.bfloat16  # the CPU runs the biggest case once
]


@pytest.mark.parametrize("backend,fmt,dtype,out_features,in_features,T", CASES, indirect=["backend"])
def test_linear(backend, fmt, dtype, out_features, in_features, T):
    b, args = quantized(fmt, out_features, in_features, backend.device, seed=out_features + in_features)
    x = randn(T, in_features, dtype=dtype, device=backend.device, seed=T)
    out = torch.full((T, out_features), NAN, dtype=dtype, device=backend.device)
    assert run(backend, fmt, x, args, out=out) is out
    assert_matches_twin(out, x, b)


@pytest.mark.parametrize("fmt", ["int8", "q4"])
@pytest.mark.parametrize("T", [2, 3])  # the token tiles 2 and 4, which the sweep above does not reach
def test_linear_reads_strided_rows_and_allocates(backend, fmt, T):
    """x as the rows of a wider buffer (a slice of a fused projection's output), out allocated by the wrapper;
    in = 100 leaves padding in the last block that must contribute nothing, although q4's padding has w = m."""
    b, args = quantized(fmt, 40, 100, backend.device, seed=3)
    wide = randn(T, 130, dtype=torch.bfloat16, device=backend.device, seed=4)
    x = wide[:, 7:107]
    assert x.stride(0) == 130
    out = run(backend, fmt, x, args)
    assert out.shape == (T, 40) and out.dtype == torch.bfloat16
    assert_matches_twin(out, x, b)


@pytest.mark.parametrize("backend", ["emulated"], indirect=True)
def test_more_than_16_tokens_is_refused(backend):
    b, args = quantized("int8", 8, 32, "cpu")
    with pytest.raises(RuntimeError, match=r"linear failed \(1\)"):  # cudaErrorInvalidValue, nothing launched
        run(backend, "int8", torch.zeros(17, 32), args)


@pytest.mark.parametrize("backend", ["emulated"], indirect=True)
def test_linear_under_other_schedules(backend):
    """Threads in reverse and the grid from its end: a missing barrier around the staged x shows up."""
    backend.module.set_schedule(False, True, True)
    try:
        for fmt in ("int8", "q4"):
            b, args = quantized(fmt, 33, 1100, "cpu", seed=5)  # three chunks: both x buffers reused
            x = randn(6, 1100, dtype=torch.float32, device="cpu", seed=6)
            assert_matches_twin(run(backend, fmt, x, args), x, b)
    finally:
        backend.module.set_schedule(False, False, False)


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_errors_name_the_values(backend):
    b, (qs, d) = quantized("int8", 8, 40, "cuda")
    x = torch.randn(2, 40, device="cuda")
    with pytest.raises(RuntimeError, match=r"x must be \[T, in\] with T <= 16 tokens, got \[17, 40\]"):
        backend.fused.linear_int8(torch.randn(17, 40, device="cuda"), qs, d)
    with pytest.raises(RuntimeError, match=r"qs must be \[out, 64\] for in = 40 \(64 inputs padded"):
        backend.fused.linear_int8(x, qs[:, :32], d)
    with pytest.raises(RuntimeError, match="d must be Half, got Float"):
        backend.fused.linear_int8(x, qs, d.float())
    _, (q4, d4, m4) = quantized("q4", 8, 40, "cuda")
    with pytest.raises(RuntimeError, match=r"m must be \[out, in_pad / 32\] = \[8, 2\], got \[8, 1\]"):
        backend.fused.linear_q4(x, q4, d4, m4[:, :1])
    with pytest.raises(RuntimeError, match="qs must be Byte, got Char"):
        backend.fused.linear_q4(x, qs, d4, m4)
