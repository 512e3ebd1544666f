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
# A decode step and every verify pass (speculative.K_MAX drafts + 1) run the GEMV, whose outputs have the same bits
# at every row count; more rows (a prefill, whose logits no decode step is compared with) take cuBLAS
GEMV_MAX_TOKENS = 17


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
        """The ops of engine.ops.OpSet, bound to this instance (and its workspaces)."""
        return dict(rmsnorm=self.rmsnorm, add_rmsnorm=self.add_rmsnorm, rope_=self.rope_, silu_mul=self.silu_mul,
                    attention=self.attention, decode_attention=self.decode_attention)

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                  scale: float, window: int = 0, sinks: int = 0, out: torch.Tensor | None = None):
        """ref.attention's signature: T queries per row, a decode step (T = 1) and a verify pass alike, on the
        same splits, so a position's output has the same bits at every T."""
        # q: [B, T, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32 on the device
        assert q.dim() == 4 and k_cache.dim() == 4, (q.shape, k_cache.shape)
        partials, counters = self.attention_workspace(q, k_cache.shape[1])
        out = q.new_empty(q.shape) if out is None else out
        self.module.decode_attention(out, q, k_cache, v_cache, seq_lens, float(scale), int(window), int(sinks),
                                     partials, counters)
        return out

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float, window: int = 0, sinks: int = 0,
                         out: torch.Tensor | None = None):
        """One query per row, ref.decode_attention's signature: q, out [B, H, D]."""
        y = self.attention(q[:, None], k_cache, v_cache, seq_lens, scale, window, sinks,
                           None if out is None else out[:, None])
        return y[:, 0] if out is None else out

    def attention_workspace(self, q: torch.Tensor, n_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Split partials [B * T, H, splits + groups, D + 4] and merge counters [B * T, H, groups + 1] for q
        [B, T, H, D] (or [B, H, D], T = 1).

        The grid is one full wave of the GPU at T = 1 whatever the cache's length (B * T rows of it for T queries),
        so the workspace depends on q's shape and Hkv only: every call on a cache, a sliced one included, and a
        captured graph see the same pointers. Allocated on the first (eager, warm-up) call per shape; the
        counters start at zero and the kernel leaves them so. Kept for up to GEMV_MAX_TOKENS queries (a step, a
        verify pass); a longer pass (an eager catch-up of any length) gets its own, freed after it."""
        q = q[:, None] if q.dim() == 3 else q
        B, T, H, D = q.shape
        key = (B, T, H, D, q.dtype, n_kv_heads, q.device)
        if key in self._workspaces:
            return self._workspaces[key]
        splits, groups, _ = self.module.decode_attention_plan(q[:, 0], n_kv_heads)  # for B rows, not B * T
        workspace = (torch.empty(B * T, H, splits + groups, D + 4, dtype=torch.float32, device=q.device),
                     torch.zeros(B * T, H, groups + 1, dtype=torch.int32, device=q.device))
        if T <= GEMV_MAX_TOKENS:
            self._workspaces[key] = workspace
        return workspace

    # --- weight-only products: int8 (GGUF Q8_0) and q4 (GGUF Q4_1) blocks, any number of rows ------------------
    # Twin: ref.linear(x, weights.dequantize(blocks)). Outside the OpSet: which linear a projection runs follows
    # its weight format, not the op set. Up to GEMV_MAX_TOKENS rows (a decode step, any verify pass) the GEMV reads
    # the blocks in place; more (a prefill, full-sequence logits, layer-skip calibration, a long catch-up)
    # dequantize the weight once into x's dtype and multiply with cuBLAS. That is how vLLM's AWQ layer
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

    # --- dense fp16 and bf16 weights [out, in]: the same GEMV up to GEMV_MAX_TOKENS rows, so their decode steps and
    # verify passes agree bit for bit too (cuBLAS picks its kernel, and so its order of sums, by the row count);
    # more rows, cuBLAS. Twin: ref.matmul_t on W^T.

    def linear_dense(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None):
        """x [T, in] @ w^T for w fp16 or bf16 [out, in] -> [T, out] in x's dtype, fp32 accumulation."""
        if x.shape[0] > GEMV_MAX_TOKENS:
            if w.dtype == x.dtype:
                return gemm(x, w, out)
            y = (x.float() @ w.float().t()).to(x.dtype)
            return y if out is None else out.copy_(y)
        out = x.new_empty(x.shape[0], w.shape[0]) if out is None else out
        self.module.linear_dense(out, x, w)
        return out


def gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """x [T, in] @ w [out, in]^T in x's dtype (cuBLAS on a GPU; fp32 accumulation for bf16 and fp16)."""
    return torch.mm(x, w.t()) if out is None else torch.mm(x, w.t(), out=out)


def ops(module: ModuleType) -> dict:
    """The kernels by op name, bound to one CudaOps: engine.ops.select builds the CUDA OpSet from them."""
    f = CudaOps(module)
    return dict(**f.opset(), linear_int8=f.linear_int8, linear_q4=f.linear_q4, linear_dense=f.linear_dense)
