"""Dense formats: the weight itself, [out, in], in fp32, fp16 or bf16.

Layouts: the torch twins (and cuBLAS for fp32) read W^T [in, out]; the CUDA GEMV reads fp16 and bf16 as rows
[out, in]; the CPU kernels read panels w [P, in, 16] with w[p, i, j] = W[16p + j, i], each widened to fp32 as it is
read (exactly) against fp32 activations: fp16 and bf16 give their fp32 widening's bits at half its bytes.
"""
from __future__ import annotations

import torch

from engine.weights import panels
from engine.weights.format import Blocks, Layout, Packed, WeightFormat
from engine.weights.panels import PANEL


def quantizer(fmt: str, dtype: torch.dtype):
    def quantize(w: torch.Tensor) -> Blocks:
        return Blocks(fmt, w.shape[0], w.shape[1], w.to(dtype).contiguous())
    return quantize


def dequantize(b: Blocks) -> torch.Tensor:
    return b.q.float()


def to_transposed(b: Blocks) -> tuple[torch.Tensor, ...]:
    return (b.q.t().contiguous(),)


def from_transposed(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    return Blocks(fmt, out, n_in, tensors[0].t().contiguous())


def transposed_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    return p.tensors[0][:, ids].t().float()


def to_rows(b: Blocks) -> tuple[torch.Tensor, ...]:
    return (b.q.contiguous(),)


def from_rows(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    return Blocks(fmt, out, n_in, tensors[0].contiguous())


def rows_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    return p.tensors[0][ids].float()


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    return (panels.dense_view(b.q).contiguous(),)


def from_panels(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    panels.check(fmt, out, n_in, tensors, (-(-out // PANEL), n_in, PANEL), 0)
    return Blocks(fmt, out, n_in, tensors[0].transpose(1, 2).reshape(-1, n_in)[:out].contiguous())


def panel_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    return p.tensors[0][ids // PANEL, :, ids % PANEL].float()


TRANSPOSED = Layout(to_transposed, from_transposed, transposed_rows)
ROWS = Layout(to_rows, from_rows, rows_rows)
PANELS = Layout(to_panels, from_panels, panel_rows)


def record(name: str, dtype: torch.dtype, bits: float, cpu: bool, gguf: str, notes: str,
           cuda_kernel: str | None = None) -> WeightFormat:
    """cuda_kernel: the CUDA GEMV that reads the format's rows (csrc/cuda/gemv.cuh); None: cuBLAS on W^T."""
    cuda = TRANSPOSED if cuda_kernel is None else ROWS
    layouts = {"torch": TRANSPOSED, "cuda": cuda} | ({"cpu": PANELS} if cpu else {})
    return WeightFormat(name=name, bits=bits, block=1, quantize=quantizer(name, dtype), dequantize=dequantize,
                        layouts=layouts, dtype=dtype, gguf=gguf, notes=notes, cuda_kernel=cuda_kernel)


FORMATS = (
    record("fp32", torch.float32, 32.0, cpu=True, gguf="F32", notes="the checkpoint's own values: the reference"),
    record("fp16", torch.float16, 16.0, cpu=True, gguf="F16", notes="half the bytes; products and sums in fp32",
           cuda_kernel="linear_dense"),
    record("bf16", torch.bfloat16, 16.0, cpu=True, gguf="BF16", notes="half the bytes, fp32's range",
           cuda_kernel="linear_dense"),
)
