"""Weight formats: what a projection's weight is stored as, and how it becomes one.

A format is chosen once at load (`load_model(..., weights="q4")`) and every projection of the model is
packed into it; the embedding and the tied LM head too.

    fp32, fp16, bf16  the weight itself, [out, in]
    int8              blocks of 32 inputs: q int8 in [-127, 127] and one fp16 scale d;  w = d * q   (GGUF Q8_0)
    q4                blocks of 32 inputs: q in [0, 15], fp16 scale d and min m;      w = d * q + m (GGUF Q4_1)
    q8                int8's blocks, run with the activations left exact: the LM head of a q4 model (GGUF Q4
                      files keep it in Q8_0), so q4 stays lossless; not a format to pick (it would be a slower
                      int8). The int8 format's CPU kernel quantizes the activations too, as llama.cpp's Q8_0 does.

`Blocks` is the canonical, layout-free form: the GGUF blocks of the default model load into it unchanged, so
q4 is lossless for that model. Kernels stream their own layouts, packed from Blocks at load (the CUDA kernels
read the canonical rows; the CPU kernels read panels of 16 outputs, csrc/cpu/); `dequantize` is the twin
every layout is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # inputs per quantization block, as in GGUF's Q8_0 and Q4_1
FORMATS = ("fp32", "fp16", "bf16", "int8", "q4")  # what a user picks
QUANTIZED = ("int8", "q4", "q8")
DENSE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BITS = {"fp32": 32.0, "fp16": 16.0, "bf16": 16.0, "int8": 8.5, "q4": 5.0, "q8": 8.5}  # incl. block scale, min


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
    if fmt != "q8":
        check_format(fmt)
    if fmt in DENSE_DTYPES:
        return Blocks(fmt, out, n_in, w.to(DENSE_DTYPES[fmt]).contiguous())
    x = _pad_blocks(w)
    if fmt in ("int8", "q8"):
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


# --- CPU panel layout (csrc/cpu/gemm.h) ---------------------------------------------------------------
#
# The CPU kernels stream weights in panels of 16 outputs (one 512-bit register of fp32 results), the 16
# outputs' weights for each input side by side; P = ceil(out / 16) panels, the padded outputs all zero
# (and never written by the kernels). nb = in_pad / 32 blocks.
#   fp32, fp16  w [P, in, 16]:            w[p, i, j] = W[16p + j, i]
#   int8        qs uint8 [P, nb, 8, 16, 4]: qs[p, b, g, j, r] = q[16p + j, 32b + 4g + r] + 128, so VNNI's
#               unsigned-by-signed dot product takes 4 inputs of 16 outputs at once; d fp16 [P, nb, 16]
#   q4          qs uint8 [P, nb, 16, 16]:  qs[p, b, i, j] = q[16p + j, 32b + 2i] | q[16p + j, 32b + 2i + 1] << 4;
#               d, m fp16 [P, nb, 16]

PANEL = 16
PANEL_FORMATS = ("fp32", "fp16", "int8", "q4", "q8")


def _pad_outputs(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [P * 16, ...], the new rows zero."""
    pad = -t.shape[0] % PANEL
    return torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) if pad else t


def _panel_scales(s: torch.Tensor) -> torch.Tensor:
    """[out, nb] -> [P, nb, 16]."""
    s = _pad_outputs(s)
    return s.view(-1, PANEL, s.shape[1]).transpose(1, 2).contiguous()


def _unpanel_scales(s: torch.Tensor, out: int) -> torch.Tensor:
    return s.transpose(1, 2).reshape(-1, s.shape[1])[:out].contiguous()


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    """Blocks -> the tensors the CPU kernel of its format takes, after x and out:
    fp32 / fp16: (w,); int8 and q8: (qs, d); q4: (qs, d, m)."""
    if b.fmt not in PANEL_FORMATS:
        raise ValueError(f"the CPU kernels have no panel layout for {b.fmt!r}; they take {', '.join(PANEL_FORMATS)}")
    if b.fmt in DENSE_DTYPES:
        w = _pad_outputs(b.q)
        return (w.view(-1, PANEL, b.in_features).transpose(1, 2).contiguous(),)
    q = _pad_outputs(b.q)
    nb = q.shape[1] // BLOCK
    if b.fmt in ("int8", "q8"):
        offset = (q.to(torch.int16) + 128).to(torch.uint8)  # offset binary: 0..254 for q in -127..127
        qs = offset.view(-1, PANEL, nb, BLOCK // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
        return qs, _panel_scales(b.d)
    pairs = q.view(-1, PANEL, nb, BLOCK // 2, 2)
    qs = (pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 3, 1).contiguous()
    return qs, _panel_scales(b.d), _panel_scales(b.m)


def from_panels(fmt: str, out_features: int, in_features: int, *tensors: torch.Tensor) -> Blocks:
    """The inverse of to_panels: the panel tensors of one weight [out_features, in_features] -> Blocks."""
    if fmt not in PANEL_FORMATS:
        raise ValueError(f"the CPU kernels have no panel layout for {fmt!r}; they take {', '.join(PANEL_FORMATS)}")
    want = {"fp32": 1, "fp16": 1, "int8": 2, "q8": 2, "q4": 3}[fmt]
    if len(tensors) != want:
        raise ValueError(f"{fmt} panels are {want} tensor(s), got {len(tensors)}")
    panels = -(-out_features // PANEL)
    nb = -(-in_features // BLOCK)
    lead = {"fp32": (panels, in_features, PANEL), "fp16": (panels, in_features, PANEL),
            "int8": (panels, nb, BLOCK // 4, PANEL, 4), "q8": (panels, nb, BLOCK // 4, PANEL, 4),
            "q4": (panels, nb, BLOCK // 2, PANEL)}[fmt]
    if tuple(tensors[0].shape) != lead:
        raise ValueError(f"{fmt} panels for [{out_features}, {in_features}] must be {list(lead)}, "
                         f"got {list(tensors[0].shape)}")
    for s in tensors[1:]:
        if tuple(s.shape) != (panels, nb, PANEL):
            raise ValueError(f"{fmt} scales for [{out_features}, {in_features}] must be {[panels, nb, PANEL]}, "
                             f"got {list(s.shape)}")
    if fmt in DENSE_DTYPES:
        q = tensors[0].transpose(1, 2).reshape(-1, in_features)[:out_features].contiguous()
        return Blocks(fmt, out_features, in_features, q)
    qs, d = tensors[0], _unpanel_scales(tensors[1], out_features)
    if fmt in ("int8", "q8"):
        q = (qs.permute(0, 3, 1, 2, 4).reshape(-1, nb * BLOCK)[:out_features].to(torch.int16) - 128).to(torch.int8)
        return Blocks(fmt, out_features, in_features, q.contiguous(), d)
    pairs = torch.stack((qs & 0xF, qs >> 4), dim=-1)  # [P, nb, 16 (i), 16 (j), 2]
    q = pairs.permute(0, 3, 1, 2, 4).reshape(-1, nb * BLOCK)[:out_features].contiguous()
    return Blocks(fmt, out_features, in_features, q, d, _unpanel_scales(tensors[2], out_features))


def panel_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """rows() for the CPU panel layout: gathers the 16-wide lanes of each id's panel, no full unpack."""
    panel, lane = ids // PANEL, ids % PANEL
    q, *scales = p.tensors
    if p.fmt in DENSE_DTYPES:
        return q[panel, :, lane].float()  # [n, in]
    scales = [s[panel, :, lane] for s in scales]  # [n, nb]
    if p.fmt in ("int8", "q8"):
        q = (q[panel, :, :, lane].to(torch.int16) - 128).to(torch.int8)  # [n, nb, 8, 4]
    else:
        q = q[panel, :, :, lane]  # [n, nb, i2]
        q = torch.stack((q & 0xF, q >> 4), dim=-1)  # [n, nb, i2, 2]
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q.reshape(len(ids), -1), *scales))
