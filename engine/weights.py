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


# ---- layouts: what one path streams ---------------------------------------------------------------------
# "torch"  the torch twins: dense formats as W^T [in, out] (on a CPU, MKL's vector-times-matrix path reads
#          that layout at 20-25 GB/s where F.linear's [out, in] reads ~11), quantized formats as canonical
#          Blocks (the twin dequantizes them per call)
# "cuda"   dense as "torch" (cuBLAS takes either); int8 rows q [out, in_pad]; q4 rows nibble-packed [out, in_pad / 2]
# "cpu"    panels of 16 outputs for the SIMD kernels (csrc/cpu/), every format
LAYOUTS = ("torch", "cuda", "cpu")


@dataclass
class Packed:
    """A weight in the layout one path streams; `tensors` are what that path's matmul takes after x."""
    fmt: str
    layout: str
    out_features: int
    in_features: int
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def pack(b: Blocks, layout: str) -> Packed:
    if layout == "cpu":
        return Packed(b.fmt, layout, b.out_features, b.in_features, to_panels(b))
    if b.fmt in DENSE_DTYPES:
        tensors = (b.q.t().contiguous(),)
    elif b.fmt == "q4" and layout == "cuda":
        tensors = (pack_nibbles(b.q), b.d, b.m)
    else:
        tensors = tuple(t for t in (b.q, b.d, b.m) if t is not None)
    return Packed(b.fmt, layout, b.out_features, b.in_features, tensors)


def unpack(p: Packed) -> Blocks:
    """The inverse of pack: exact, so switching paths never changes a weight."""
    if p.layout == "cpu":
        return from_panels(p.fmt, p.out_features, p.in_features, *p.tensors)
    if p.fmt in DENSE_DTYPES:
        return Blocks(p.fmt, p.out_features, p.in_features, p.tensors[0].t().contiguous())
    q, *scales = p.tensors
    if p.fmt == "q4" and p.layout == "cuda":
        q = unpack_nibbles(q)
    return Blocks(p.fmt, p.out_features, p.in_features, q, *scales)


def rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """Output rows `ids` of the weight, dequantized: [len(ids), in] fp32 (a tied embedding's lookup)."""
    if p.layout == "cpu":
        return panel_rows(p, ids)
    if p.fmt in DENSE_DTYPES:
        return p.tensors[0][:, ids].t().float()
    q, *scales = (t[ids] for t in p.tensors)
    if p.fmt == "q4" and p.layout == "cuda":
        q = unpack_nibbles(q)
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q, *scales))


# ---- the CPU panel layout (csrc/cpu/) -------------------------------------------------------------------
# P = ceil(out / 16) panels of 16 outputs; outputs past out_features are zero and never written. With 16
# outputs in one 512-bit register and x broadcast from memory, the kernels amortize each block's scale over
# 16 outputs x 32 inputs, so a pass over T rows costs about T multiply-adds per weight loaded.
#   fp32 / fp16  w [P, in, 16]:               w[p, i, j] = W[16p + j, i]
#   q4           q [P, nb, 16, 16] uint8:     byte [p, b, i2, j] = q[16p + j, 32b + 2 i2] | q[.., 32b + 2 i2 + 1] << 4
#                d, m [P, nb, 16] fp16
#   int8         q [P, nb, 8, 16, 4] uint8:   byte [p, b, g, j, r] = q[16p + j, 32b + 4g + r] + 128 (offset binary,
#                d [P, nb, 16] fp16           the unsigned operand of vpdpbusd; the kernel corrects the offset)
PANEL = 16
CPU_FORMATS = ("fp32", "fp16", "int8", "q4")


def _panel_rows(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [P, 16, ...], zero-padded to whole panels."""
    pad = -t.shape[0] % PANEL
    t = torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t
    return t.view(-1, PANEL, *t.shape[1:])


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    if b.fmt not in CPU_FORMATS:
        raise ValueError(f"weights={b.fmt!r} has no CPU kernel; on a CPU use one of {', '.join(CPU_FORMATS)}")
    if b.fmt in DENSE_DTYPES:
        return (_panel_rows(b.q).transpose(1, 2).contiguous(),)  # [P, in, 16]
    scales = tuple(_panel_rows(s).transpose(1, 2).contiguous() for s in (b.d, b.m) if s is not None)  # [P, nb, 16]
    q = _panel_rows(b.q)  # [P, 16, in_pad]
    if b.fmt == "int8":
        q = (q.to(torch.int16) + 128).to(torch.uint8).view(q.shape[0], PANEL, -1, 8, 4)  # [P, 16, nb, 8, 4]
        return (q.permute(0, 2, 3, 1, 4).contiguous(), *scales)  # [P, nb, 8, 16, 4]
    q = q.view(q.shape[0], PANEL, -1, 16, 2)  # [P, 16, nb, i2, 2]
    q = q[..., 0] | (q[..., 1] << 4)  # [P, 16, nb, 16]
    return (q.permute(0, 2, 3, 1).contiguous(), *scales)  # [P, nb, 16 (i2), 16 (j)]


def from_panels(fmt: str, out_features: int, in_features: int, *tensors: torch.Tensor) -> Blocks:
    """The inverse of to_panels."""
    q, *scales = tensors
    scales = [s.transpose(1, 2).reshape(-1, s.shape[1])[:out_features] for s in scales]  # [out, nb]
    if fmt in DENSE_DTYPES:
        return Blocks(fmt, out_features, in_features, q.transpose(1, 2).reshape(-1, q.shape[1])[:out_features])
    if fmt == "int8":
        q = (q.permute(0, 3, 1, 2, 4).to(torch.int16) - 128).to(torch.int8)  # [P, 16, nb, 8, 4]
    else:
        q = q.permute(0, 3, 1, 2)  # [P, 16, nb, i2]
        q = torch.stack((q & 0xF, q >> 4), dim=-1)  # [P, 16, nb, i2, 2]
    return Blocks(fmt, out_features, in_features, q.reshape(-1, q.shape[2] * 32)[:out_features], *scales)


def panel_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """rows() for the CPU panel layout: gathers the 16-wide lanes of each id's panel, no full unpack."""
    panel, lane = ids // PANEL, ids % PANEL
    q, *scales = p.tensors
    if p.fmt in DENSE_DTYPES:
        return q[panel, :, lane].float()  # [n, in]
    scales = [s[panel, :, lane] for s in scales]  # [n, nb]
    if p.fmt == "int8":
        q = (q[panel, :, :, lane].to(torch.int16) - 128).to(torch.int8)  # [n, nb, 8, 4]
    else:
        q = q[panel, :, :, lane]  # [n, nb, i2]
        q = torch.stack((q & 0xF, q >> 4), dim=-1)  # [n, nb, i2, 2]
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q.reshape(len(ids), -1), *scales))
