"""Static, preallocated KV cache, and the one owner of the sequence length.

seq_lens lives on the device, so a decode step never reads a length back to the host and its shapes never
depend on position: positions come from seq_lens, the KV write is an index_put at those positions, and
attention reads keys j < seq_len only. Entries past seq_len are never read, so rollback is a fill.
`length` is seq_lens' host mirror (batch 1 and equal rows), moved only by the methods below, always together
with the device copy, so nothing ever reads the device to learn it.
"""
from __future__ import annotations

import copy

import torch

from engine.config import ModelConfig


def position_bytes(n_layers: int, kv_size: int, dtype: torch.dtype) -> int:
    """The K and V bytes a cached position holds over n_layers layers of kv_size values each (Hkv * head_dim)."""
    return 2 * n_layers * kv_size * dtype.itemsize


class KVCache:
    def __init__(self, cfg: ModelConfig, batch_size: int, max_seq_len: int, dtype: torch.dtype, device):
        self.cfg = cfg
        shape = (cfg.n_layers, batch_size, cfg.n_kv_heads, max_seq_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=device)  # [B]
        self.length = 0
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len
        self.rows = torch.arange(batch_size, device=device)  # [B], for index_put
        self.layer_k, self.layer_v = list(self.k.unbind(0)), list(self.v.unbind(0))  # views: [B, Hkv, S, D] each
        self.source: KVCache | None = None  # the cache whose layers this one runs on (layers())

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes one position adds, over all layers (what a decode step reads per cached token)."""
        B, Hkv, S, D = self.layer_k[0].shape
        return position_bytes(len(self.layer_k), Hkv * D, self.k.dtype)

    def layers(self, keep, cfg: ModelConfig) -> KVCache:
        """A cache over this one's layers `keep` (its layer j is layer keep[j] here), sharing their storage, with
        a length of its own: a layer-skip drafter's view reads the K/V the target wrote for the layers it runs,
        and writes its drafts past the target's length, where the verify pass overwrites them."""
        view = copy.copy(self)
        view.cfg = cfg
        view.layer_k, view.layer_v = [self.layer_k[i] for i in keep], [self.layer_v[i] for i in keep]
        view.seq_lens = torch.zeros_like(self.seq_lens)
        view.length, view.source = 0, self
        return view

    def advance(self, n: int) -> None:
        """n new positions per row, whose K/V the next forward writes (a device add: no sync)."""
        self.seq_lens.add_(n)
        self.length += n

    def set_length(self, n: int) -> None:
        """Every row to n live entries: a rollback after rejected drafts, or the prompt length at prefill."""
        self.seq_lens.fill_(n)
        self.length = n

    def copy_prefix(self, source: KVCache, n: int) -> None:
        """Positions 0..n-1 of every layer := source's, the length n: what a prefill over those n tokens leaves
        (a layer-skip calibration's forward over a short prompt, engine/speculative/layerskip.py)."""
        self.k[:, :, :, :n].copy_(source.k[:, :, :, :n])
        self.v[:, :, :, :n].copy_(source.v[:, :, :, :n])
        self.set_length(n)

    def scratch(self, n: int) -> KVCache:
        """A cache of its own with this one's shape and n positions, all live: a forward of n tokens on it writes
        positions 0..n-1 of its own tensors, which nothing reads. Graph warm-up runs the step for real before the
        capture, and this cache, near max_seq_len, has no n free positions past its length: a write there is out
        of bounds, which on a GPU is a device-side assert and a dead CUDA context."""
        cache = KVCache(self.cfg, self.batch_size, n, self.k.dtype, self.k.device)
        cache.set_length(n)
        return cache

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              start: int | None = None) -> None:
        """k, v: [B, T, Hkv, D] into positions [B, T] (values < S). With `start`, the host knows they are
        start..start+T-1 in every row, and a slice copy does it; without (a captured graph, where only the
        device knows the positions), an index_put."""
        if start is not None:
            T = k.shape[1]
            self.layer_k[layer][:, :, start:start + T] = k.transpose(1, 2)
            self.layer_v[layer][:, :, start:start + T] = v.transpose(1, 2)
            return
        rows = self.rows[:, None]  # index_put takes the cache's dtype only (the slice copy above converts)
        self.layer_k[layer][rows, :, positions] = k.to(self.k.dtype)
        self.layer_v[layer][rows, :, positions] = v.to(self.v.dtype)
