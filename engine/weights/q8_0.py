"""int8 and q8: GGUF's Q8_0 blocks. Per block of 32 inputs: q int8 in [-127, 127] and one fp16 scale d;
w = d * q. Quantized with d = max|w| / 127, q = round(w / d).

int8 is the format a user picks; its CPU kernel quantizes the activations too (W8A8, as llama.cpp runs Q8_0).
q8 is the same blocks for the LM head of a q4 model (GGUF Q4 files keep it in Q8_0): its CPU kernel takes the
activations at 16 bits per block, as the q4 kernel does (csrc/cpu/q16.h), near exact where int8's 8 bits
cost top-1 agreement; not a format to pick.

CPU panels: qs uint8 [P, nb, 8, 16, 4] with qs[p, b, g, j, r] = q[16p + j, 32b + 4g + r] + 128, so VNNI's
unsigned-by-signed dot product takes 4 inputs of 16 outputs at once; d fp16 [P, nb, 16].
"""
from __future__ import annotations

import torch

from engine.weights import gguf_bytes, panels
from engine.weights.format import BLOCK, Blocks, Layout, Packed, WeightFormat
from engine.weights.panels import PANEL


def quantizer(fmt: str):
    def quantize(w: torch.Tensor) -> Blocks:
        x = panels.pad_blocks(w)
        d = (x.abs().amax(-1) / 127).half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round(x * inv[..., None]).clamp_(-127, 127).to(torch.int8)
        return Blocks(fmt, w.shape[0], w.shape[1], q.view(w.shape[0], -1), d)
    return quantize


def dequantize(b: Blocks) -> torch.Tensor:
    w = b.q.float().view(b.out_features, -1, BLOCK) * b.d.float()[..., None]
    return w.view(b.out_features, -1)[:, : b.in_features]


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    q = panels.pad_outputs(b.q)
    nb = q.shape[1] // BLOCK
    offset = (q.to(torch.int16) + 128).to(torch.uint8)  # offset binary: 0..254 for q in -127..127
    qs = offset.view(q.shape[0] // PANEL, PANEL, nb, BLOCK // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
    return qs, panels.scales(b.d)


def from_panels(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    P, nb = -(-out // PANEL), -(-n_in // BLOCK)
    panels.check(fmt, out, n_in, tensors, (P, nb, BLOCK // 4, PANEL, 4), 1)
    qs, d = tensors
    q = (qs.permute(0, 3, 1, 2, 4).reshape(-1, nb * BLOCK)[:out].to(torch.int16) - 128).to(torch.int8)
    return Blocks(fmt, out, n_in, q.contiguous(), panels.unscales(d, out))


def panel_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` dequantized [len(ids), in]: a tied head's embedding lookup, once a decode step. The kernel
    library's q8_rows where it is loaded (these ~8 torch ops took ~52 us a token, 1.5% of the default model's
    step); the torch form below is its twin."""
    qs, d = p.tensors
    if (lib := panels.native()) is not None and qs.is_contiguous() and d.is_contiguous():
        out = torch.empty(ids.numel(), p.in_features)
        lib.q8_rows(out, qs, d, ids.reshape(-1).long().contiguous())
        return out
    q = (qs[ids // PANEL, :, :, ids % PANEL].to(torch.int16) - 128).to(torch.int8)  # [n, nb, 8, 4]
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q.reshape(len(ids), -1), panels.lane_scales(d, ids)))


def canonical(b: Blocks) -> tuple[torch.Tensor, ...]:
    return b.q, b.d


def from_canonical(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    return Blocks(fmt, out, n_in, *tensors)


def canonical_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    q, d = (t[ids] for t in p.tensors)
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q, d))


def decoder(fmt: str):
    """GGUF Q8_0 block (34 bytes): fp16 d, 32 int8."""
    def from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
        b = gguf_bytes.blocks(raw, out, 34)
        return Blocks(fmt, out, n_in, b[..., 2:].contiguous().view(torch.int8).reshape(out, -1),
                      gguf_bytes.f16(b, 0))
    return from_gguf


def to_gguf(b: Blocks) -> torch.Tensor:
    q = b.q.view(torch.uint8).view(b.out_features, -1, BLOCK)
    return torch.cat((gguf_bytes.f16_bytes(b.d), q), -1).reshape(b.out_features, -1)


ROWS = Layout(canonical, from_canonical, canonical_rows)  # the torch twins and the CUDA GEMV read the rows
# a file's Q8_0 tensor packs a chunk of rows at a time (panels.blocks_pack_gguf): the fmt its Blocks carry is not read
LAYOUTS = {"torch": ROWS, "cuda": ROWS, "cpu": Layout(to_panels, from_panels, panel_rows,
                                                   panels.blocks_pack_gguf(34, decoder("int8"), to_panels))}

FORMATS = (
    WeightFormat(name="int8", bits=8.5, block=BLOCK, quantize=quantizer("int8"), dequantize=dequantize,
                 layouts=LAYOUTS, cpu_activations="int8", cuda_kernel="linear_int8", gguf="Q8_0",
                 from_gguf=decoder("int8"), to_gguf=to_gguf, exact_in=("q8",),
                 notes="GGUF Q8_0 blocks; the CPU kernel quantizes the activations too (W8A8)"),
    WeightFormat(name="q8", bits=8.5, block=BLOCK, quantize=quantizer("q8"), dequantize=dequantize,
                 layouts=LAYOUTS, pickable=False, cpu_activations="int16", cuda_kernel="linear_int8", gguf="Q8_0",
                 from_gguf=decoder("q8"), to_gguf=to_gguf, exact_in=("int8",),
                 notes="Q8_0 blocks, activations at 16 bits on a CPU: a q4 model's head"),
)
