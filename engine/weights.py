"""Weight formats: what a projection's weight is stored as, and how it becomes one.

A format is chosen once at load (`load_model(..., weights="q4")`) and every projection of the model is
packed into it; the embedding and the tied LM head too.

    fp32, fp16, bf16  the weight itself, [out, in]
    int8              blocks of 32 inputs: q int8 in [-127, 127] and one fp16 scale d;  w = d * q   (GGUF Q8_0)
    q4                blocks of 32 inputs: q in [0, 15], fp16 scale d and min m;      w = d * q + m (GGUF Q4_1)

`Blocks` is the canonical, layout-free form: the GGUF blocks of the default model load into it unchanged, so
q4 is lossless for that model. Kernels stream their own layouts, packed from Blocks at load (the CUDA kernels
read the canonical rows; the CPU kernels read panels of 16 outputs, csrc/cpu/); `dequantize` is the twin
every layout is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # inputs per quantization block, as in GGUF's Q8_0 and Q4_1
FORMATS = ("fp32", "fp16", "bf16", "int8", "q4")
QUANTIZED = ("int8", "q4")
DENSE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "int8": 8.5, "q4": 5.0}  # incl. block scale and min


@dataclass
class Blocks:
    """One weight [out, in] in a format, canonical layout.

    dense formats: q is the weight [out, in] in the format's dtype; d and m are None.
    int8: q int8 [out, in_pad], d fp16 [out, in_pad / 32].  q4: q uint8 in 0..15 [out, in_pad], d and m fp16.
    in_pad is `in` rounded up to a whole block; the padding holds zeros (and contributes nothing)."""
    fmt: str
    out_features: int
    in_features: int
    q: torch.Tensor
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        """Bytes a matrix-vector product reads: the weight once, scales and mins included."""
        q_bytes = self.q.numel() // 2 if self.fmt == "q4" else self.q.numel() * self.q.element_size()
        return q_bytes + sum(t.numel() * t.element_size() for t in (self.d, self.m) if t is not None)


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"weights={fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def _pad_blocks(w: torch.Tensor) -> torch.Tensor:
    """[out, in] fp32 -> [out, nb, 32], zero-padded to whole blocks."""
    out, n_in = w.shape
    pad = -n_in % BLOCK
    return torch.nn.functional.pad(w.float(), (0, pad)).view(out, -1, BLOCK)


def quantize(w: torch.Tensor, fmt: str) -> Blocks:
    """w [out, in] (any float dtype) -> Blocks. int8: d = max|w| / 127 per block, q = round(w / d).
    q4: d = (max - min) / 15, m = min, q = round((w - m) / d); the fp16-rounded d and m are the ones used."""
    out, n_in = w.shape
    check_format(fmt)
    if fmt in DENSE_DTYPES:
        return Blocks(fmt, out, n_in, w.to(DENSE_DTYPES[fmt]).contiguous())
    x = _pad_blocks(w)
    if fmt == "int8":
        d = (x.abs().amax(-1) / 127).half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round(x * inv[..., None]).clamp_(-127, 127).to(torch.int8)
        return Blocks(fmt, out, n_in, q.view(out, -1), d)
    lo, hi = x.amin(-1), x.amax(-1)
    d, m = ((hi - lo) / 15).half(), lo.half()
    inv = torch.where(d == 0, 0.0, 1.0 / d.float())
    q = torch.round((x - m.float()[..., None]) * inv[..., None]).clamp_(0, 15).to(torch.uint8)
    return Blocks(fmt, out, n_in, q.view(out, -1), d, m)


def dequantize(b: Blocks) -> torch.Tensor:
    """Blocks -> the fp32 weight [out, in] the format stands for (the twin of every kernel's weight read)."""
    if b.fmt in DENSE_DTYPES:
        return b.q.float()
    q = b.q.float().view(b.out_features, -1, BLOCK)
    w = q * b.d.float()[..., None]
    if b.fmt == "q4":
        w = w + b.m.float()[..., None]
    return w.view(b.out_features, -1)[:, : b.in_features]


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q4 values [out, in_pad] (0..15) -> bytes [out, in_pad / 2] in GGUF's Q4_1 order: byte j of a block holds
    element j in its low nibble and element j + 16 in its high nibble."""
    x = q.view(q.shape[0], -1, 2, BLOCK // 2)
    return (x[:, :, 0] | (x[:, :, 1] << 4)).view(q.shape[0], -1)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_nibbles."""
    x = packed.view(packed.shape[0], -1, BLOCK // 2)
    return torch.stack((x & 0xF, x >> 4), dim=2).view(packed.shape[0], -1)
