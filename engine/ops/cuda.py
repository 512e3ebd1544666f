"""Thin wrappers over the CUDA kernels (csrc/cuda/*.cuh), with the signatures of the twins in ref.py.

They allocate outputs (or write into `out=`) and the decode-attention workspace; the extension checks
shapes, dtypes and devices and says which value is wrong. `ops(module)` is what engine.ops.select uses.
"""
from __future__ import annotations

from types import ModuleType

import torch

from engine.ops.rowwise import RowwiseOps

# csrc/cuda/decode_attention.cuh plans its splits on the device from seq_lens; these mirror its constants and rule
# for the analysis bench/attention.py reports (tests check the mirror against the kernel).
ATTN_TILE_BYTES = 8192  # K (and V) per pipeline stage
ATTN_STAGES = 3
ATTN_MIN_TILES_PER_SPLIT = ATTN_STAGES - 1
GEMV_MAX_TOKENS = 16  # csrc/cuda/gemv.cuh's largest token tile; more rows take the dequantize + GEMM route


def attention_tile_keys(head_dim: int, dtype: torch.dtype) -> int:
    return ATTN_TILE_BYTES // (head_dim * dtype.itemsize)


def live_keys(seq_len: int, window: int = 0, sinks: int = 0) -> int:
    """Keys a row attends: all seq_len, or the sinks plus the window once they no longer cover the row."""
    return sinks + window if window > 0 and seq_len > sinks + window else seq_len


def active_splits(n_keys: int, tile_keys: int, splits: int) -> tuple[int, int]:
    """(splits that get work, keys per split) for n_keys live keys on a grid of `splits` splits per (row, kv
    head): at least ATTN_MIN_TILES_PER_SPLIT tiles per split, and the fewest splits at that many tiles each."""
    tiles = -(-n_keys // tile_keys)
    want = max(1, min(splits, -(-tiles // ATTN_MIN_TILES_PER_SPLIT)))
    per = max(1, -(-tiles // want))
    return max(1, -(-tiles // per)), per * tile_keys


class CudaOps(RowwiseOps):
    """Holds the extension and the attention workspaces, one per (q's shape and dtype, Hkv, device)."""

    def __init__(self, module: ModuleType):
        super().__init__(module)
        self._workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def opset(self) -> dict:
        """The five ops of engine.ops.OpSet, bound to this instance (and its workspaces)."""
        return dict(rmsnorm=self.rmsnorm, add_rmsnorm=self.add_rmsnorm, rope_=self.rope_, silu_mul=self.silu_mul,
                    decode_attention=self.decode_attention)

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float, window: int = 0, sinks: int = 0,
                         out: torch.Tensor | None = None):
        # q: [B, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32 on the device
        assert q.dim() == 3 and k_cache.dim() == 4, (q.shape, k_cache.shape)
        partials, counters = self.attention_workspace(q, k_cache.shape[1])
        out = torch.empty_like(q) if out is None else out
        self.module.decode_attention(out, q, k_cache, v_cache, seq_lens, float(scale), int(window), int(sinks),
                                     partials, counters)
        return out

    def attention_workspace(self, q: torch.Tensor, n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split partials [B, H, splits + groups, D + 4] and merge counters [B, H, groups + 1].

        The grid is one full wave of the GPU whatever the cache's length, so the workspace depends on q's shape
        and Hkv only: every call on a cache, a sliced one included, and a captured graph see the same pointers.
        Allocated on the first (eager, warm-up) call; the counters start at zero and the kernel leaves them so."""
        B, H, D = q.shape
        key = (B, H, D, q.dtype, n_kv_heads, q.device)
        if key not in self._workspaces:
            splits, groups, _ = self.module.decode_attention_plan(q, n_kv_heads)
            self._workspaces[key] = (
                torch.empty(B, H, splits + groups, D + 4, dtype=torch.float32, device=q.device),
                torch.zeros(B, H, groups + 1, dtype=torch.int32, device=q.device),
            )
        return self._workspaces[key]

    # --- weight-only products: int8 (GGUF Q8_0) and q4 (GGUF Q4_1) blocks, any number of rows ------------------
    # Twin: ref.linear(x, weights.dequantize(blocks)). Outside the OpSet: which linear a projection runs follows
    # its weight format, not the op set. Up to GEMV_MAX_TOKENS rows (a decode step, a verify pass) the GEMV reads
    # the blocks in place; more (a prefill, full-sequence logits, layer-skip calibration, a long verify pass or
    # catch-up) dequantize the weight once into x's dtype and multiply with cuBLAS. That is how vLLM's AWQ layer
    # runs large batches (awq_dequantize, then torch.matmul) and what llama.cpp falls back to past its mat-vec
    # kernel's batch limit (dequantize to fp16, then cuBLAS): one write and one read of the dense weight on top of
    # the blocks (csrc/cuda/dequantize.cuh counts the bytes), in exchange for tensor-core GEMMs at any row count and no
    # second product kernel to keep exact; a tiled kernel over the blocks (llama.cpp's MMQ) would read less from
    # 17 to ~100 rows, which bench/gemv.py's 17- and 64-row figures will say is worth writing or not. The route is
    # fixed by the row count, so a captured graph (one T) holds one of the two.

    def linear_int8(self, x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, out: torch.Tensor | None = None):
        """x [T, in] @ W^T with W = d * q: qs int8 [out, in_pad], d fp16 [out, in_pad / 32] -> [T, out]."""
        if x.shape[0] > GEMV_MAX_TOKENS:
            w = x.new_empty(qs.shape[0], x.shape[1])
            self.module.dequantize_int8(w, qs, d)
            return gemm(x, w, out)
        out = x.new_empty(x.shape[0], qs.shape[0]) if out is None else out
        self.module.linear_int8(out, x, qs, d)
        return out

    def linear_q4(self, x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                  out: torch.Tensor | None = None):
        """x [T, in] @ W^T with W = d * q + m: qs uint8 [out, in_pad / 2] from weights.pack_nibbles, d and m
        fp16 [out, in_pad / 32] -> [T, out]."""
        if x.shape[0] > GEMV_MAX_TOKENS:
            w = x.new_empty(qs.shape[0], x.shape[1])
            self.module.dequantize_q4(w, qs, d, m)
            return gemm(x, w, out)
        out = x.new_empty(x.shape[0], qs.shape[0]) if out is None else out
        self.module.linear_q4(out, x, qs, d, m)
        return out


def gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """x [T, in] @ w [out, in]^T in x's dtype (cuBLAS on a GPU; fp32 accumulation for bf16 and fp16)."""
    return torch.mm(x, w.t()) if out is None else torch.mm(x, w.t(), out=out)


def ops(module: ModuleType) -> dict:
    """The kernels by op name, bound to one CudaOps: engine.ops.select builds the CUDA OpSet from them."""
    f = CudaOps(module)
    return dict(**f.opset(), linear_int8=f.linear_int8, linear_q4=f.linear_q4)
