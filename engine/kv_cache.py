"""Static, preallocated KV cache.

seq_lens lives on the device, so a decode step never reads a length back to the host and its shapes never
depend on position: positions come from seq_lens, the KV write is an index_put at those positions, and
attention masks keys j >= seq_len. Entries past seq_len are never read, so rollback is a fill.
"""
from __future__ import annotations

import torch

from engine.config import ModelConfig


class KVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_seq_len: int, dtype: torch.dtype, device):
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_seq_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=device)  # [B]
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.rows = torch.arange(batch_size, device=device)  # [B], for index_put

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def reset(self) -> None:
        self.seq_lens.zero_()

    def fill(self, n: int) -> None:
        """Roll every row back (or forward) to n live entries."""
        self.seq_lens.fill_(n)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        # k, v: [B, T, Hkv, D]; positions: [B, T] (values < S)
        rows = self.rows[:, None]
        self.k[layer][rows, :, positions] = k
        self.v[layer][rows, :, positions] = v
