"""q4_0 and q5_0: GGUF's symmetric Q4_0 and Q5_0 blocks. Per block of 32 inputs: q a signed integer (-8..7,
or -16..15) and one fp16 scale d; w = d * q. Quantized as ggml does: d = v / -8 (or -16) for v the value of
largest magnitude (so it lands on the grid's longer side), q = round(w / d) clamped.

Canonical Blocks hold q as int8 [out, in_pad] and d [out, nb]: the very shape of Q8_0's, so a file's Q4_0 / Q5_0
tensors also load as int8 (or q8) blocks exactly (`exact_in`). Their own CPU kernel (csrc/cpu/legacy.h) reads the
file's bytes, 16 rows interleaved field by field (panels.interleave), against int8 activations as llama.cpp runs
them: 4.5 / 5.5 bits a weight where int8's blocks take 8.5.
"""
from __future__ import annotations

import torch

from engine.weights import gguf_bytes, panels, q8_0
from engine.weights.format import BLOCK, Blocks, WeightFormat


def quantizer(fmt: str, bits: int):
    half = 1 << (bits - 1)

    def quantize(w: torch.Tensor) -> Blocks:
        x = panels.pad_blocks(w)
        far = x.gather(-1, x.abs().argmax(-1, keepdim=True))[..., 0]  # the signed value of largest magnitude
        d = (far / -half).half()
        inv = torch.where(d == 0, 0.0, 1.0 / d.float())
        q = torch.round(x * inv[..., None]).clamp_(-half, half - 1).to(torch.int8)
        return Blocks(fmt, w.shape[0], w.shape[1], q.view(w.shape[0], -1), d)
    return quantize


def q4_0_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """GGUF Q4_0 block (18 bytes): fp16 d, 16 bytes (byte j: element j low nibble, j + 16 high), q - 8."""
    b = gguf_bytes.blocks(raw, out, 18)
    qs = b[..., 2:]
    q = torch.cat((qs & 0xF, qs >> 4), -1).to(torch.int8) - 8
    return Blocks("q4_0", out, n_in, q.reshape(out, -1), gguf_bytes.f16(b, 0))


def q4_0_to_gguf(b: Blocks) -> torch.Tensor:
    u = (b.q.to(torch.int16) + 8).to(torch.uint8).view(b.out_features, -1, BLOCK)
    qs = gguf_bytes.nibbles(u[..., :16], u[..., 16:])
    return torch.cat((gguf_bytes.f16_bytes(b.d), qs), -1).reshape(b.out_features, -1)


def q5_0_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """GGUF Q5_0 block (22 bytes): fp16 d, 32 high bits (uint32 little-endian: bit j is element j's), 16 bytes
    of low nibbles as Q4_0's; q - 16."""
    b = gguf_bytes.blocks(raw, out, 22)
    q = gguf_bytes.quants5(b[..., 2:6], b[..., 6:]).to(torch.int8) - 16
    return Blocks("q5_0", out, n_in, q.reshape(out, -1), gguf_bytes.f16(b, 0))


def q5_0_to_gguf(b: Blocks) -> torch.Tensor:
    u = (b.q.to(torch.int16) + 16).to(torch.uint8).view(b.out_features, -1, BLOCK)
    qh, qs = gguf_bytes.quants5_bytes(u)
    return torch.cat((gguf_bytes.f16_bytes(b.d), qh, qs), -1).reshape(b.out_features, -1)


# each block's fields as (bytes, unit) in ggml-common.h's order (panels.interleave): d, (qh,) qs
FIELDS = {"q4_0": ((2, 2), (16, 4)), "q5_0": ((2, 2), (4, 4), (16, 4))}


def record(name: str, bits: int, gguf: str, decode, encode) -> WeightFormat:
    cpu = panels.gguf_layout(BLOCK, FIELDS[name], decode, encode, q8_0.dequantize)
    return WeightFormat(name=name, bits=bits + 0.5, block=BLOCK, quantize=quantizer(name, bits),
                        dequantize=q8_0.dequantize, layouts={"torch": q8_0.ROWS, "cpu": cpu}, cpu_activations="int8",
                        gguf=gguf, from_gguf=decode, to_gguf=encode, exact_in=("int8", "q8"),
                        notes=f"GGUF {gguf} blocks; the CPU kernel reads the file's bytes against int8 activations")


FORMATS = (
    record("q4_0", 4, "Q4_0", q4_0_from_gguf, q4_0_to_gguf),
    record("q5_0", 5, "Q5_0", q5_0_from_gguf, q5_0_to_gguf),
)
