"""q4 and q4_a8: GGUF's Q4_1 blocks; q5_1: GGUF's Q5_1. Per block of 32 inputs: q in [0, 15] (Q5_1: [0, 31]), fp16
scale d and min m; w = d * q + m. Quantized with d = (max - min) / 15 (31), m = min, q = round((w - m) / d); the
fp16-rounded d and m are used.

The two formats are the same blocks and layouts; they differ in what the CPU kernel does with the activations:
q4 quantizes them to 16 bits per block (csrc/cpu/q16.h, near exact, 16 integer instructions a row and block),
q4_a8 to int8 per block as llama.cpp runs Q4_1 (Q8_1's recipe: 8 instructions, so a verify pass of several
tokens costs less; its error is llama.cpp's). On CUDA both run q4's GEMV. Each holds the other's blocks exactly
(exact_in), so a file's Q4_1 tensors load as either without a second rounding.

CUDA rows: q nibble-packed [out, in_pad / 2] in GGUF's order (pack_nibbles), d and m [out, nb].
CPU panels: one stream w uint8 [P, nb, 320] (csrc/cpu/kernels.h), each block of 16 outputs x 32 inputs as 4
chunks c of [16 outputs j][4 bytes r] with byte = q[16p + j, 32b + 8c + r] | q[16p + j, 32b + 8c + 4 + r] << 4
(256 bytes), then the block's d[16] and m[16] fp16 (64 bytes): 5 bits a weight, one forward stream a panel,
and a chunk's nibbles masked or shifted are VNNI and AMX operands as they stand.

q5_1 (the fallback of llama.cpp's Q5_K mixes for rows that are not whole super-blocks: SmolLM2's 576 and 960) keeps
q4's canonical Blocks (q as uint8 0..31) and twin; its CPU panels are the file's bytes interleaved by 16 rows, as
Q5_0's (panels.gguf_layout), against int8 activations as llama.cpp runs Q5_1 on Q8_1's (csrc/cpu/legacy.h).
"""
from __future__ import annotations

import torch

from engine.weights import gguf_bytes, panels
from engine.weights.format import BLOCK, Blocks, Layout, Packed, WeightFormat
from engine.weights.panels import PANEL


def quantizer(fmt: str, top: int = 15):
    def quantize(w: torch.Tensor) -> Blocks:
        x = panels.pad_blocks(w)
        lo, hi = x.amin(-1), x.amax(-1)
        d, m = ((hi - lo) / top).half(), lo.half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round((x - m.float()[..., None]) * inv[..., None]).clamp_(0, top).to(torch.uint8)
        return Blocks(fmt, w.shape[0], w.shape[1], q.view(w.shape[0], -1), d, m)
    return quantize


def dequantize(b: Blocks) -> torch.Tensor:
    w = b.q.float().view(b.out_features, -1, BLOCK) * b.d.float()[..., None] + b.m.float()[..., None]
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


CHUNKS, CHUNK_INPUTS = 4, 8  # a block's 32 inputs as 4 chunks of 8: 4 in the low nibbles, 4 in the high
NIBBLE_BYTES = BLOCK // 2 * PANEL  # 256


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    q = panels.pad_outputs(b.q)
    P, nb = q.shape[0] // PANEL, q.shape[1] // BLOCK
    x = q.view(P, PANEL, nb, CHUNKS, 2, 4)  # [P, j, b, c, low/high, r]: input 8c + 4 * high + r
    nibbles = (x[:, :, :, :, 0] | (x[:, :, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(P, nb, NIBBLE_BYTES)
    scales = torch.cat((panels.scales(b.d), panels.scales(b.m)), -1).view(torch.uint8)  # [P, nb, 64]
    return (torch.cat((nibbles, scales), -1).contiguous(),)


def split_stream(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A panel stream [..., nb, 320] -> q [..., nb, 16 (j), 32 (input)] (0..15), d and m [..., nb, 16]."""
    nib = w[..., :NIBBLE_BYTES].unflatten(-1, (CHUNKS, PANEL, 4))  # [..., c, j, r]
    q = torch.stack((nib & 0xF, nib >> 4), dim=-2)  # [..., c, j, low/high, r]
    q = q.movedim(-4, -3).flatten(-3)  # [..., j, c * 8 + 4 * high + r]
    dm = w[..., NIBBLE_BYTES:].contiguous().view(torch.float16)  # [..., 32]
    return q, dm[..., :PANEL], dm[..., PANEL:]


def from_panels(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    P, nb = -(-out // PANEL), -(-n_in // BLOCK)
    panels.check(fmt, out, n_in, tensors, (P, nb, NIBBLE_BYTES + 4 * PANEL), 0)
    q, d, m = split_stream(tensors[0])  # q: [P, nb, 16, 32]
    q = q.permute(0, 2, 1, 3).reshape(-1, nb * BLOCK)[:out].contiguous()
    return Blocks(fmt, out, n_in, q, panels.unscales(d, out), panels.unscales(m, out))


def panel_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    q, d, m = split_stream(p.tensors[0][ids // PANEL])  # [n, nb, 16, 32], [n, nb, 16]
    lane = torch.arange(len(ids)), ids % PANEL
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, q[lane[0], :, lane[1]].reshape(len(ids), -1),
                             d[lane[0], :, lane[1]], m[lane[0], :, lane[1]]))


def canonical(b: Blocks) -> tuple[torch.Tensor, ...]:
    return b.q, b.d, b.m


def from_canonical(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    return Blocks(fmt, out, n_in, *tensors)


def canonical_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, *(t[ids] for t in p.tensors)))


def to_nibble_rows(b: Blocks) -> tuple[torch.Tensor, ...]:
    return pack_nibbles(b.q), b.d, b.m


def from_nibble_rows(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    q, d, m = tensors
    return Blocks(fmt, out, n_in, unpack_nibbles(q), d, m)


def nibble_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    q, d, m = (t[ids] for t in p.tensors)
    return dequantize(Blocks(p.fmt, len(ids), p.in_features, unpack_nibbles(q), d, m))


def from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """GGUF Q4_1 block (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles (pack_nibbles' order)."""
    b = gguf_bytes.blocks(raw, out, 20)
    return Blocks("q4", out, n_in, unpack_nibbles(b[..., 4:].reshape(out, -1)), gguf_bytes.f16(b, 0),
                  gguf_bytes.f16(b, 2))


def to_gguf(b: Blocks) -> torch.Tensor:
    q = pack_nibbles(b.q).view(b.out_features, -1, BLOCK // 2)
    return torch.cat((gguf_bytes.f16_bytes(b.d), gguf_bytes.f16_bytes(b.m), q), -1).reshape(b.out_features, -1)


def q5_1_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """GGUF Q5_1 block (24 bytes): fp16 d, fp16 m, 32 fifth bits (uint32 little-endian: bit j is element j's),
    16 bytes of low nibbles in pack_nibbles' order."""
    b = gguf_bytes.blocks(raw, out, 24)
    q = gguf_bytes.quants5(b[..., 4:8], b[..., 8:])
    return Blocks("q5_1", out, n_in, q.reshape(out, -1), gguf_bytes.f16(b, 0), gguf_bytes.f16(b, 2))


def q5_1_to_gguf(b: Blocks) -> torch.Tensor:
    qh, qs = gguf_bytes.quants5_bytes(b.q.view(b.out_features, -1, BLOCK))
    return torch.cat((gguf_bytes.f16_bytes(b.d), gguf_bytes.f16_bytes(b.m), qh, qs), -1).reshape(b.out_features, -1)


Q5_1_FIELDS = ((2, 2), (2, 2), (4, 4), (16, 4))  # d, m, qh, qs: each block's fields (panels.interleave)

LAYOUTS = {"torch": Layout(canonical, from_canonical, canonical_rows),
           "cuda": Layout(to_nibble_rows, from_nibble_rows, nibble_rows),
           "cpu": Layout(to_panels, from_panels, panel_rows, panels.blocks_pack_gguf(20, from_gguf, to_panels))}

FORMATS = (
    WeightFormat(name="q4", bits=5.0, block=BLOCK, quantize=quantizer("q4"), dequantize=dequantize, layouts=LAYOUTS,
                 cpu_activations="int16", head="q8", cuda_kernel="linear_q4", gguf="Q4_1", from_gguf=from_gguf,
                 to_gguf=to_gguf, exact_in=("q4_a8",),
                 notes="GGUF Q4_1 blocks: the default model's own, so lossless for it"),
    WeightFormat(name="q4_a8", bits=5.0, block=BLOCK, quantize=quantizer("q4_a8"), dequantize=dequantize,
                 layouts=LAYOUTS, cpu_activations="int8", head="int8", cuda_kernel="linear_q4", gguf="Q4_1",
                 to_gguf=to_gguf, exact_in=("q4",),
                 notes="q4's blocks against int8 activations on a CPU, as llama.cpp runs Q4_1: a cheaper verify pass"),
    WeightFormat(name="q5_1", bits=6.0, block=BLOCK, quantize=quantizer("q5_1", 31), dequantize=dequantize,
                 layouts={"torch": LAYOUTS["torch"],
                          "cpu": panels.gguf_layout(BLOCK, Q5_1_FIELDS, q5_1_from_gguf, q5_1_to_gguf, dequantize)},
                 cpu_activations="int8", gguf="Q5_1", from_gguf=q5_1_from_gguf, to_gguf=q5_1_to_gguf,
                 notes="GGUF Q5_1 blocks (Q5_K mixes' fallback); the CPU kernel reads the file's bytes against int8 "
                       "activations"),
)
