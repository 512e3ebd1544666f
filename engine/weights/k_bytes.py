"""The K-quants' GGUF bytes (ggml-common.h block_q2_K .. block_q6_K) <-> canonical Blocks (engine/weights/k_quants.py).

Each from_gguf reads a tensor's raw blocks into the twins' fields (q one value an input, d, dmin, the sub-blocks'
integer scales and mins), as ggml's dequantize_row_* reads them; each to_gguf writes them back, so a codec
round-trips a file's bytes exactly (tests/test_gguf_weights.py).
"""
from __future__ import annotations

import torch

from engine.weights import gguf_bytes
from engine.weights.format import Blocks

QK = 256  # inputs per super-block


def unpack_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 bytes of 6-bit scales and mins of Q4_K / Q5_K -> sc, mn [..., 8] (ggml's get_scale_min_k4):
    sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins); 4..7 split, low 4 bits in bytes
    8..11 (scale low nibble, min high nibble), high 2 bits in the top bits of bytes 0..3 and 4..7."""
    s = s.to(torch.int32)
    sc = torch.cat((s[..., 0:4] & 63, (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)), -1)
    mn = torch.cat((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), -1)
    return sc.to(torch.uint8), mn.to(torch.uint8)


def pack_scales(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    sc, mn = sc.to(torch.int32), mn.to(torch.int32)
    first = sc[..., 0:4] | ((sc[..., 4:8] >> 4) << 6)
    second = mn[..., 0:4] | ((mn[..., 4:8] >> 4) << 6)
    third = (sc[..., 4:8] & 0xF) | ((mn[..., 4:8] & 0xF) << 4)
    return torch.cat((first, second, third), -1).to(torch.uint8)


def _low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K's 128 bytes -> 256 values: bytes 32i..32i+31 hold inputs 64i + l (low) and 64i + 32 + l (high)."""
    qs = qs.reshape(*qs.shape[:-1], 4, 32)
    return torch.stack((qs & 0xF, qs >> 4), -2).reshape(*qs.shape[:-2], QK)


def _pack_low_nibbles(q: torch.Tensor) -> torch.Tensor:
    q = q.reshape(*q.shape[:-1], 4, 2, 32)
    return gguf_bytes.nibbles(q[..., 0, :] & 0xF, q[..., 1, :] & 0xF).reshape(*q.shape[:-3], 128)


def decoder_qk(fmt: str, bits: int):
    """Q4_K (144 bytes): fp16 d, fp16 dmin, 12 bytes of scales, 128 of nibbles. Q5_K (176 bytes): the same with
    32 bytes of high bits (qh) before the nibbles; input 64i + l takes bit 2i of qh[l], 64i + 32 + l bit 2i + 1."""
    size = 144 if bits == 4 else 176

    def from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
        b = gguf_bytes.blocks(raw, out, size)
        sc, mn = unpack_scales(b[..., 4:16])
        q = _low_nibbles(b[..., size - 128:])
        if bits == 5:
            high = gguf_bytes.unbits(b[..., 16:48].reshape(out, -1, 32, 1)).reshape(out, -1, 32, 8)
            q = q | (high.transpose(-1, -2).reshape(out, -1, QK) << 4)
        return Blocks(fmt, out, n_in, q.reshape(out, -1), gguf_bytes.f16(b, 0), gguf_bytes.f16(b, 2),
                      sc.reshape(out, -1), mn.reshape(out, -1))
    return from_gguf


def encoder_qk(bits: int):
    def to_gguf(b: Blocks) -> torch.Tensor:
        out = b.out_features
        q = b.q.view(out, -1, QK)
        parts = [gguf_bytes.f16_bytes(b.d), gguf_bytes.f16_bytes(b.m),
                 pack_scales(b.sc.view(out, -1, 8), b.mn.view(out, -1, 8))]
        if bits == 5:
            high = (q >> 4).view(out, -1, 8, 32).transpose(-1, -2)  # [out, ns, l, bit]
            parts.append(gguf_bytes.bits_of(high.reshape(out, -1, 256), 32))
        parts.append(_pack_low_nibbles(q))
        return torch.cat(parts, -1).reshape(out, -1)
    return to_gguf


def q6_k_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, fp16 d last. In each
    half of 128 inputs (ql 64 bytes A|B, qh 32 bytes): inputs l, 32 + l, 64 + l, 96 + l take A's low, B's low,
    A's high, B's high nibble of byte l and bits 0-1, 2-3, 4-5, 6-7 of qh[l]."""
    b = gguf_bytes.blocks(raw, out, 210)
    ql = b[..., :128].reshape(out, -1, 2, 2, 32)  # [out, ns, half, A|B, l]
    qh = b[..., 128:192].reshape(out, -1, 2, 1, 32)
    low = torch.stack((ql & 0xF, ql >> 4), 3)  # [out, ns, half, low|high nibble, A|B, l]
    shifts = torch.tensor([[0, 2], [4, 6]], dtype=torch.uint8).view(2, 2, 1)
    high = (qh[..., None, :, :] >> shifts) & 3
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(out, -1)
    sc = b[..., 192:208].contiguous().view(torch.int8).reshape(out, -1)
    return Blocks("q6_k", out, n_in, q, gguf_bytes.f16(b, 208), None, sc)


def q6_k_to_gguf(b: Blocks) -> torch.Tensor:
    out = b.out_features
    u = (b.q.to(torch.int16) + 32).to(torch.uint8).view(out, -1, 2, 2, 2, 32)  # [.., half, nibble, A|B, l]
    ql = gguf_bytes.nibbles(u[..., 0, :, :] & 0xF, u[..., 1, :, :] & 0xF).reshape(out, -1, 128)
    hi = (u >> 4).reshape(out, -1, 2, 4, 32)  # the four quarters of a half: shifts 0, 2, 4, 6
    qh = (hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)).reshape(out, -1, 64)
    sc = b.sc.view(torch.uint8).view(out, -1, 16)
    return torch.cat((ql, qh, sc, gguf_bytes.f16_bytes(b.d)), -1).reshape(out, -1)


PAIRS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)  # the shifts of a byte's four 2-bit fields
Q3_K_HIGH = torch.arange(8, dtype=torch.uint8).view(2, 4, 1)  # input 128n + 32j + l: hmask[l]'s bit 4n + j


def _qs_fields(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K's and Q3_K's 64 qs bytes [out, ns, 64] -> their 2-bit fields [out, ns, n, j, l]: input 128n + 32j + l
    (l < 32) is bits 2j, 2j + 1 of qs[32n + l]."""
    return (qs.reshape(*qs.shape[:-1], 2, 1, 32) >> PAIRS.view(4, 1)) & 3


def _qs_bytes(u: torch.Tensor) -> torch.Tensor:
    """The inverse of _qs_fields: fields [out, ns, n, j, l] (0..3) -> qs bytes [out, ns, 64]."""
    return (u << PAIRS.view(4, 1)).sum(-2, dtype=torch.uint8).reshape(*u.shape[:-3], 64)  # disjoint: the sum is an OR


def q3_k_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """Q3_K (110 bytes): 32 bytes of high bits (hmask), 64 of 2-bit quants (qs), 12 of 6-bit scales, fp16 d last
    (ggml's dequantize_row_q3_K). Input 128n + 32j + l (l < 32) is bits 2j, 2j + 1 of qs[32n + l], less 4 where
    bit 4n + j of hmask[l] is clear. Scale s (sub-block of 16) stored + 32: its low 4 bits in byte s % 8 (the low
    nibble for s < 8, the high one after), its high 2 in bits 2 (s // 4), 2 (s // 4) + 1 of byte 8 + s % 4."""
    b = gguf_bytes.blocks(raw, out, 110)
    hm = b[..., None, None, 0:32]  # [out, ns, 1, 1, l]
    low = _qs_fields(b[..., 32:96])  # [out, ns, n, j, l]
    high = (hm >> Q3_K_HIGH) & 1
    q = (low.to(torch.int8) - 4 * (1 - high.to(torch.int8))).reshape(out, -1)
    s = b[..., 96:108]
    nib = torch.cat((s[..., :8] & 0xF, s[..., :8] >> 4), -1)  # [out, ns, 16]
    top = (s[..., 8:12, None] >> PAIRS) & 3  # [out, ns, s % 4, s // 4]
    sc = (nib | (top.transpose(-1, -2).reshape(*nib.shape) << 4)).to(torch.int8) - 32
    return Blocks("q3_k", out, n_in, q, gguf_bytes.f16(b, 108), None, sc.reshape(out, -1))


def q3_k_to_gguf(b: Blocks) -> torch.Tensor:
    out = b.out_features
    u = (b.q.to(torch.int16) + 4).to(torch.uint8).view(out, -1, 2, 4, 32)  # [out, ns, n, j, l], 0..7
    qs = _qs_bytes(u & 3)
    hm = ((u >> 2) << Q3_K_HIGH).reshape(out, -1, 8, 32).sum(-2, dtype=torch.uint8)
    v = (b.sc.to(torch.int16) + 32).to(torch.uint8).view(out, -1, 16)
    nib = (v[..., :8] & 0xF) | ((v[..., 8:] & 0xF) << 4)
    top = (v >> 4).view(out, -1, 4, 4).transpose(-1, -2) << PAIRS
    return torch.cat((hm, qs, nib, top.sum(-1, dtype=torch.uint8), gguf_bytes.f16_bytes(b.d)), -1).reshape(out, -1)


def q2_k_from_gguf(raw: torch.Tensor, out: int, n_in: int) -> Blocks:
    """Q2_K (84 bytes): 16 scale bytes (sub-block s's scale in the low nibble of byte s, its min in the high one),
    64 bytes of 2-bit quants (qs), fp16 d and dmin last (ggml's dequantize_row_q2_K). Input 128n + 32j + l (l < 32)
    is bits 2j, 2j + 1 of qs[32n + l], as Q3_K's low bits."""
    b = gguf_bytes.blocks(raw, out, 84)
    q = _qs_fields(b[..., 16:80]).reshape(out, -1)
    s = b[..., :16]
    return Blocks("q2_k", out, n_in, q, gguf_bytes.f16(b, 80), gguf_bytes.f16(b, 82), (s & 0xF).reshape(out, -1),
                  (s >> 4).reshape(out, -1))


def q2_k_to_gguf(b: Blocks) -> torch.Tensor:
    out = b.out_features
    qs = _qs_bytes(b.q.view(out, -1, 2, 4, 32))
    s = (b.sc | (b.mn << 4)).view(out, -1, 16)
    return torch.cat((s, qs, gguf_bytes.f16_bytes(b.d), gguf_bytes.f16_bytes(b.m)), -1).reshape(out, -1)
