"""GGUF's block bytes as torch tensors: what every format's codec (from_gguf / to_gguf) shares.

A GGUF tensor [out, in] of a block type is `out` rows of in / block_size blocks, each block a fixed run of bytes
(ggml-common.h: the fp16 scales first for most types, last for Q6_K). A codec cuts rows into blocks and fields.
"""
from __future__ import annotations

import torch


def blocks(raw: torch.Tensor, out: int, block_bytes: int) -> torch.Tensor:
    """uint8 [out, row bytes] -> [out, nb, block_bytes], checking the size."""
    if raw.dtype != torch.uint8 or raw.numel() % (out * block_bytes):
        raise ValueError(f"{raw.numel()} bytes of {raw.dtype} are not {out} rows of whole {block_bytes}-byte blocks")
    return raw.reshape(out, -1, block_bytes)


def f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte `at` of every block: [out, nb, B] -> [out, nb]."""
    return b[..., at:at + 2].contiguous().view(torch.float16)[..., 0]


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp16 [...] -> uint8 [..., 2], little-endian as GGUF stores it."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(*x.shape, 2)


def nibbles(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Two uint8 tensors of values 0..15 -> bytes lo | hi << 4."""
    return (lo | (hi << 4)).to(torch.uint8)


def bits_of(x: torch.Tensor, n: int) -> torch.Tensor:
    """[..., 8k] bits -> [..., k] bytes, bit i of byte j from x[..., 8j + i]."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return (x.view(*x.shape[:-1], n, 8).to(torch.uint8) << shifts).sum(-1, dtype=torch.uint8)


def quants5(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """A 5-bit block's quants (Q5_0, Q5_1), 0..31 uint8 [..., 32], from its 4 bytes of fifth bits (a little-endian
    uint32, bit j element j's) and 16 bytes of low nibbles (byte j: element j low, element j + 16 high)."""
    return torch.cat((qs & 0xF, qs >> 4), -1) | (unbits(qh) << 4)


def quants5_bytes(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of quants5: uint8 quants 0..31 [..., 32] -> (fifth bits [..., 4], nibbles [..., 16])."""
    return bits_of(u >> 4, 4), nibbles(u[..., :16] & 0xF, u[..., 16:] & 0xF)


def unbits(b: torch.Tensor) -> torch.Tensor:
    """[..., k] bytes -> [..., 8k] bits, the inverse of bits_of."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((b[..., None] >> shifts) & 1).reshape(*b.shape[:-1], -1)
