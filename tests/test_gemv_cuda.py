"""The int8 and q4 products (csrc/gemv.cuh up to 16 rows, csrc/dequantize.cuh + a GEMM beyond) against their twin,
ref.linear(x, weights.dequantize(blocks)), through the wrappers in engine/ops/cuda.py, on both backends of
tests/cuda_backends.py; the dequantize kernel alone against weights.dequantize; on a GPU, q4 and int8 models whose
prefill, verify pass and decode step go through both routes, against the same models on the torch twins.

Outputs are poisoned with NaN before each launch. Sizes are awkward on purpose: 1 and 17 output rows (a
block's rows mostly idle), 769 (not a multiple of any block's rows), inputs 32 (one quantization block), 96
(a chunk's lanes mostly idle) and 576 (two chunks, the second partial), T 1, 6 and 16 (token tiles 1, 8, 16),
then 17 and 40 rows (the dequantize route).

Tolerance: kernel and twin accumulate in fp32 and round once, but the GEMV takes the block's scale (and min)
out of the block's sum and adds in another order. fp32 rounding over `in` terms stays far below
1e-5 * sum_i |w_i x_i| (the worst case is in * 2^-24 of it; a random order gives about sqrt(in) * 2^-24),
plus one ulp of the output dtype where bf16/fp16 round that sum. The dequantize route holds the weights in x's
dtype: exact in fp32 (the dequantize kernel is the twin bit for bit), rounded to half an ulp in bf16/fp16, which
adds at most eps / 2 * sum_i |w_i x_i|; a GEMM allowed reduced-precision reductions (torch's default for
bf16/fp16 on a GPU) rounds its partial sums, at most another eps / 2 of the same sum. So that route's bound in
bf16/fp16 gains eps * sum_i |w_i x_i|.
"""
from __future__ import annotations


import pytest
import torch

from cuda_backends import DTYPES, NAN, make_backend, randn
from engine import Engine, load_model, ops, weights
from engine.ops import cuda, ref
from engine.tiny import tiny_cuda_config, write_tiny_model


@pytest.fixture(scope="module", params=["cuda", pytest.param("emulated", marks=pytest.mark.emulation)])
def backend(request):
    return make_backend(request.param)


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
    eps = 0 if x.dtype == torch.float32 else torch.finfo(x.dtype).eps
    dequantized = x.shape[0] > cuda.GEMV_MAX_TOKENS  # the route that holds the weights in x's dtype
    bound = (1e-5 + (eps if dequantized else 0)) * magnitude + eps * want.float().abs()
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


ROUTE_CASES = [
    pytest.param(name, fmt, dtype, o, i, T, id=f"{name}-{fmt}-{str(dtype)[6:]}-o{o}-i{i}-T{T}")
    for name, sizes in [("cuda", [(17, 96), (769, 576), (1, 32)]), ("emulated", [(17, 100), (40, 576)])]
    for fmt in ("int8", "q4")
    for dtype in DTYPES
    for o, i in sizes
    for T in (17, 40)
]


@pytest.mark.parametrize("backend,fmt,dtype,out_features,in_features,T", ROUTE_CASES, indirect=["backend"])
def test_more_than_16_rows_take_the_dequantize_route(backend, fmt, dtype, out_features, in_features, T):
    """A prefill, full-sequence logits, layer-skip calibration, a verify pass of 17 or a long catch-up: every row
    count runs, past the GEMV's 16 rows through the dense weight and a GEMM."""
    b, args = quantized(fmt, out_features, in_features, backend.device, seed=out_features + T)
    x = randn(T, in_features, dtype=dtype, device=backend.device, seed=T)
    out = torch.full((T, out_features), NAN, dtype=dtype, device=backend.device)
    assert run(backend, fmt, x, args, out=out) is out
    assert_matches_twin(out, x, b)
    wide = randn(T, in_features + 9, dtype=dtype, device=backend.device, seed=T + 1)[:, 5:5 + in_features]
    assert_matches_twin(run(backend, fmt, wide, args), wide, b)  # rows of a wider buffer, out allocated


DEQUANTIZE_CASES = [
    pytest.param(name, fmt, dtype, o, i, id=f"{name}-{fmt}-{str(dtype)[6:]}-o{o}-i{i}")
    for name, sizes in [("cuda", [(1, 32), (17, 100), (769, 576), (300, 2048)]), ("emulated", [(1, 32), (17, 100)])]
    for fmt in ("int8", "q4")
    for dtype in DTYPES
    for o, i in sizes
]


@pytest.mark.parametrize("backend,fmt,dtype,out_features,in_features", DEQUANTIZE_CASES, indirect=["backend"])
def test_dequantize_is_the_twin_bit_for_bit(backend, fmt, dtype, out_features, in_features):
    """weights.dequantize(blocks) cast to the dtype, exactly: the products with d and then m round as the twin's do.
    in = 100 ends inside a block, whose padding must not be written past the row."""
    b, args = quantized(fmt, out_features, in_features, backend.device, seed=in_features)
    buf = torch.full((out_features * in_features + 8,), NAN, dtype=dtype, device=backend.device)
    out = buf[:-8].view(out_features, in_features)
    getattr(backend.module, f"dequantize_{fmt}")(out, *args)
    want = weights.dequantize(b).to(device=backend.device, dtype=dtype)
    assert torch.equal(out, want), (out - want).abs().max()
    assert buf[-8:].isnan().all(), "written past the matrix"


@pytest.mark.parametrize("backend", ["emulated"], indirect=True)
def test_the_gemv_launcher_refuses_more_than_16_tokens(backend):
    """The launcher's contract: 1..16 tokens, nothing launched beyond (the wrapper routes those rows elsewhere)."""
    b, (qs, d) = quantized("int8", 8, 32, "cpu")
    with pytest.raises(RuntimeError, match=r"linear failed \(1\)"):  # cudaErrorInvalidValue, nothing launched
        backend.module.linear_int8(torch.empty(17, 8), torch.zeros(17, 32), qs, d)


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
        backend.module.linear_int8(torch.empty(17, 8, device="cuda"), torch.randn(17, 40, device="cuda"), qs, d)
    with pytest.raises(RuntimeError, match=r"qs must be \[out, 64\] for in = 40 \(64 inputs padded"):
        backend.fused.linear_int8(x, qs[:, :32], d)
    with pytest.raises(RuntimeError, match="d must be Half, got Float"):
        backend.fused.linear_int8(x, qs, d.float())
    _, (q4, d4, m4) = quantized("q4", 8, 40, "cuda")
    with pytest.raises(RuntimeError, match=r"m must be \[out, in_pad / 32\] = \[8, 2\], got \[8, 1\]"):
        backend.fused.linear_q4(x, q4, d4, m4[:, :1])
    with pytest.raises(RuntimeError, match="qs must be Byte, got Char"):
        backend.fused.linear_q4(x, qs, d4, m4)
    # the dequantize route: the weight's `in` is out's width
    with pytest.raises(RuntimeError, match=r"qs must be \[out, 96\] for in = 70 \(96 inputs padded"):
        backend.module.dequantize_int8(torch.empty(8, 70, device="cuda"), qs, d)
    with pytest.raises(RuntimeError, match=r"out must be \[out, in\] = \[8, 40\], got \[9, 40\]"):
        backend.module.dequantize_q4(torch.empty(9, 40, device="cuda"), q4, d4, m4)
    with pytest.raises(RuntimeError, match="out must be float32, float16 or bfloat16, got Int"):
        backend.module.dequantize_int8(torch.empty(8, 40, dtype=torch.int32, device="cuda"), qs, d)
    with pytest.raises(RuntimeError, match=r"qs must be \[out, 64\] for in = 40"):  # a wrong weight, past 16 rows
        backend.fused.linear_int8(torch.randn(20, 40, device="cuda"), qs[:, :32], d)


# --- a whole model on each route --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernel_sized_model(tmp_path_factory):
    """A tiny model at head_dim 64, so the fused kernels run it (tiny_config's head_dim 16 runs the twins)."""
    return write_tiny_model(tmp_path_factory.mktemp("gemv_model"), tiny_cuda_config(), seed=3)


def cuda_path(backend, folder, fmt: str, dtype: str):
    """The model on the CUDA kernels: the extension on a GPU, the emulated kernels on a CPU."""
    if backend.name == "cuda":
        return load_model(folder, device="cuda", dtype=dtype, weights=fmt)
    model = load_model(folder, dtype=dtype, weights=fmt, fused=False)
    model.use_ops(ops.cuda_ops(backend.module, "the CUDA kernels on the CPU emulation"))
    return model


def twin_path(backend, folder, fmt: str, dtype: str):
    """The same model on the torch twins of the CUDA path (activations exact, as the GPU's kernels keep them)."""
    model = load_model(folder, device=backend.device, dtype=dtype, weights=fmt, fused=False)
    model.use_ops(ops.twin_ops("the twins of the CUDA kernels", "cuda"))
    return model


def forwards(model, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float32 logits of a 40-token prefill (every position: the dequantize route), a 17-token verify pass on top
    (the route again), then a decode step (the GEMV and the decode attention)."""
    ids = [(7 * i + 3) % 256 for i in range(60)]
    eng = Engine(model, max_seq_len=128)
    with torch.inference_mode():
        prefill = eng.logits(ids[:40])
        verify = eng.chunk(torch.tensor([ids[40:57]], device=device))[0].float()
        step = eng.decode(torch.tensor([ids[57]], device=device))[0].float()
    return prefill, verify, step


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not got.isnan().any()
    return (got - want).abs().max().item()


# fp32: the fused path and its twins differ in summation order only (GEMM, GEMV and the row-wise kernels, each
# ~1e-6 relative; about 3e-6 of the largest logit after 4 layers on the emulation), so 1e-4 of it.
MODEL_FP32_TOL = 1e-4


@pytest.mark.parametrize("fmt", ["q4", "int8"])
def test_quantized_models_prefill_verify_and_step_like_their_twins(backend, kernel_sized_model, fmt):
    """The q4 app's first prompt on a GPU: prefill, verify and step through both routes, in fp32."""
    fused = cuda_path(backend, kernel_sized_model, fmt, "fp32")
    assert fused.ops.name == "fused" and fused.ops.layout == "cuda", fused.ops.reason
    want = forwards(twin_path(backend, kernel_sized_model, fmt, "fp32"), backend.device)
    for name, got, w in zip(("prefill", "verify", "step"), forwards(fused, backend.device), want, strict=True):
        assert max_error(got, w) <= MODEL_FP32_TOL * w.abs().max().item(), name


@pytest.mark.parametrize("fmt", ["q4", "int8"])
def test_quantized_models_in_bf16_stay_within_bf16s_own_error(backend, kernel_sized_model, fmt):
    """bf16 rounds every activation to 8 bits, and the route's weights too (the twin keeps them fp32): against the
    fp32 twins, the fused path's error may be at most twice the bf16 twins' own (on the emulation it is 1.0 to 1.15
    times it); a wrong block, scale, row or dtype moves logits by their own size."""
    fused = forwards(cuda_path(backend, kernel_sized_model, fmt, "bf16"), backend.device)
    twin = forwards(twin_path(backend, kernel_sized_model, fmt, "bf16"), backend.device)
    exact = forwards(twin_path(backend, kernel_sized_model, fmt, "fp32"), backend.device)
    for name, f, t, e in zip(("prefill", "verify", "step"), fused, twin, exact, strict=True):
        assert max_error(f, e) <= 2 * max_error(t, e), name
