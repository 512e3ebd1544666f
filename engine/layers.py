"""The pieces every block is built from: Linear over a packed weight, an embedding kept in its file's blocks,
RMSNorm, and the ForwardContext every module of a forward reads. Shape letters: engine/model.py's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import ops as ops_mod
from engine import weights
from engine.config import Rope
from engine.kv_cache import KVCache


@dataclass
class ForwardContext:
    """What every layer needs for one forward call."""
    mode: str  # "prefill" | "cached"
    B: int
    T: int
    positions: torch.Tensor  # [B, T] long
    start: int | None  # the first new position when the host knows it (eager calls); None in a captured graph
    cache: KVCache
    kv_limit: int  # keys read from the cache: S, or a host-known bound for eager calls
    ops: ops_mod.OpSet
    rope_tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]]  # cos, sin [max_pos, D/2] fp32 per rope
    window: int = 0  # > 0: cached attention reads the first `sinks` keys and the last `window` only
    sinks: int = 0

    def __post_init__(self):
        self.flat_positions = self.positions.reshape(-1)  # [N], what rope takes: once, not once a layer


class Linear(nn.Module):
    """y = x @ W^T (+ bias) for a weight W [out, in] held in a format and a layout (engine/weights.py), or in row
    segments of several formats (weights.Stacked: a merged projection whose parts a file stores in different types).

    The loader sets the weight; Transformer.use_ops repacks it into the layout the chosen path streams and
    fixes the matmul that streams it, once: the kernel for the format where it runs, else its torch twin."""

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = d_in, d_out
        self.bias = nn.Parameter(torch.empty(d_out)) if bias else None
        self.weight: weights.Packed | weights.Stacked | None = None
        self.matmul = None

    def place(self, ops: ops_mod.OpSet) -> None:
        self.weight = weights.place(self.weight, ops.layout)  # exact: switching paths never changes a weight
        self.matmul = ops.matmul(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.weight)  # x: [N, in] -> [N, out]
        return y if self.bias is None else y.add_(self.bias)


class BlockEmbedding(nn.Module):
    """An untied embedding table [V, C] kept in its file's blocks (GGUF bytes [V, row bytes] of a weight format):
    a lookup decodes the rows it reads, so the table never exists in floats (Qwen2.5-7B's would be 2.2 GB in fp32)."""

    def __init__(self, fmt: str, raw: torch.Tensor, dim: int):
        super().__init__()
        self.fmt, self.num_embeddings, self.embedding_dim = fmt, raw.shape[0], dim
        self.register_buffer("raw", raw, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.reshape(-1)
        b = weights.get(self.fmt).from_gguf(self.raw[ids], len(ids), self.embedding_dim)
        return weights.dequantize(b).view(*tokens.shape, -1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
