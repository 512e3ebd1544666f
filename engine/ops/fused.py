"""Thin wrappers over the compiled kernels, with the signatures of the twins in ref.py.

They allocate outputs (or write into `out=`) and the decode-attention workspace; the extension checks
shapes, dtypes and devices and says which value is wrong. `ops(module)` is what engine.ops.select uses.
"""
from __future__ import annotations

import functools
import math
from types import ModuleType

import torch

MAX_CHUNK = 256  # keys per split when there are enough (batch, kv head) pairs to fill the GPU
MIN_CHUNK = 64


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":  # the kernels' CPU test runtime (csrc/testing/) runs one block at a time
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_splits(batch: int, n_kv_heads: int, max_len: int, sms: int) -> tuple[int, int]:
    """(chunk, splits) for a cache of max_len positions: the largest chunk in 256, 128, 64 that still gives
    about two blocks per SM. Depends only on the cache's shape, so a captured graph keeps its grid."""
    chunk = MAX_CHUNK
    while chunk > MIN_CHUNK and batch * n_kv_heads * math.ceil(max_len / chunk) < 2 * sms:
        chunk //= 2
    return chunk, math.ceil(max_len / chunk)


class FusedOps:
    """Holds the extension and the attention workspaces, one per (B, H, splits, D, device)."""

    def __init__(self, module: ModuleType):
        self.module = module
        self._workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None):
        out = torch.empty_like(x) if out is None else out
        self.module.rmsnorm(out, x, weight, float(eps))
        return out

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        self.module.add_rmsnorm(x, residual, weight, float(eps))
        return x

    def rope_(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              positions: torch.Tensor) -> None:
        self.module.rope(q, k, cos, sin, positions)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None):
        if out is None:
            assert gate_up.shape[-1] % 2 == 0, gate_up.shape
            out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
        self.module.silu_mul(out, gate_up)
        return out

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None):
        # q: [B, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32 on the device
        assert q.dim() == 3 and k_cache.dim() == 4, (q.shape, k_cache.shape)
        B, H, D = q.shape
        chunk, splits = plan_splits(B, k_cache.shape[1], k_cache.shape[2], sm_count(q.device))
        acc, ml = self.workspace(B, H, splits, D, q.device)
        out = torch.empty_like(q) if out is None else out
        self.module.decode_attention(out, q, k_cache, v_cache, seq_lens, float(scale), acc, ml, chunk)
        return out

    def workspace(self, B: int, H: int, splits: int, D: int, device: torch.device):
        """Split partials, allocated once per shape so a captured graph sees the same pointers on replay.
        Allocated on the first (eager, warm-up) call; nothing is allocated during capture after that."""
        key = (B, H, splits, D, device)
        if key not in self._workspaces:
            self._workspaces[key] = (
                torch.empty(B, H, splits, D, dtype=torch.float32, device=device),
                torch.empty(B, H, splits, 2, dtype=torch.float32, device=device),
            )
        return self._workspaces[key]


def ops(module: ModuleType) -> dict:
    """The five ops, keyed as in engine.ops.OpSet, bound to one FusedOps."""
    f = FusedOps(module)
    return dict(rmsnorm=f.rmsnorm, add_rmsnorm=f.add_rmsnorm, rope_=f.rope_, silu_mul=f.silu_mul,
                decode_attention=f.decode_attention)
