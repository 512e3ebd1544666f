"""The llama-family transformer: Transformer -> Block -> Attention / MLP, with three attention paths.

Letters used in shape comments:
  B batch rows, T tokens per row in this call, N = B*T, H query heads, Hkv kv heads, D head_dim,
  S the cache's max length, V vocab size, C hidden size, I intermediate size.

Paths (all write their new K/V into the static cache at positions taken from cache.seq_lens):
  prefill  causal attention over the prompt itself (SDPA); the cache starts empty.
  decode   one query per row against the cache (ops.decode_attention; the fused kernel on CUDA).
  chunk    a few queries per row on top of the cache (verifying drafts), masked key j <= position.
The residual stream goes through add+rmsnorm, so a block is attn -> (add + norm) -> mlp -> (add + norm)
and the norm of the next block (or the final norm) is fused into this block's last add.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops as ops_mod
from engine.config import ModelConfig, rope_inv_freq
from engine.kv_cache import KVCache

# SDPA learned grouped-query attention in torch 2.5; older torch repeats K/V on the prefill path only.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class Step:
    """What every layer needs for one forward call."""
    mode: str  # "prefill" | "decode" | "chunk"
    B: int
    T: int
    positions: torch.Tensor  # [B, T] long
    seq_lens: torch.Tensor  # [B] int32, live lengths after this call's tokens are written
    cache: KVCache
    kv_limit: int  # keys read from the cache: S, or a host-known bound for eager calls
    ops: ops_mod.OpSet
    cos: torch.Tensor
    sin: torch.Tensor


class Linear(nn.Module):
    """y = x @ weight + bias, the weight stored [in, out].

    At batch 1 every projection is a matrix-vector product that streams its weight once. On our 2-core
    CPU box MKL's vector-times-matrix over [in, out] rows reads 20-25 GB/s where F.linear's [out, in]
    path reads ~11 GB/s (a SmolLM2 decode step: 65 -> 52 ms). cuBLAS takes either layout."""

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.empty(d_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight if self.bias is None else torch.addmm(self.bias, x, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        # q, k and v in one matmul: one weight read and one kernel launch instead of three
        self.wqkv = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.wo = Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim ** -0.5

    def forward(self, x: torch.Tensor, s: Step) -> torch.Tensor:
        cfg, B, T = self.cfg, s.B, s.T
        q, k, v = self.wqkv(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(B * T, cfg.n_heads, cfg.head_dim).contiguous()  # [N, H, D]
        k = k.reshape(B * T, cfg.n_kv_heads, cfg.head_dim).contiguous()  # [N, Hkv, D]
        s.ops.rope_(q, k, s.cos, s.sin, s.positions.reshape(-1))
        s.cache.write(self.layer, k.view(B, T, -1, cfg.head_dim), v.reshape(B, T, -1, cfg.head_dim), s.positions)
        if s.mode == "prefill":
            y = self._prefill(q, k, v.reshape(B * T, -1, cfg.head_dim), s)
        elif s.mode == "decode":
            kc = s.cache.k[self.layer][:, :, : s.kv_limit]
            vc = s.cache.v[self.layer][:, :, : s.kv_limit]
            y = s.ops.decode_attention(q, kc, vc, s.seq_lens, self.scale)  # [B, H, D]
        else:
            y = self._chunk(q, s)
        return self.wo(y.reshape(B * T, cfg.q_size))

    def _prefill(self, q, k, v, s: Step) -> torch.Tensor:
        B, T, cfg = s.B, s.T, self.cfg
        q = q.view(B, T, -1, cfg.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = k.view(B, T, -1, cfg.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(B, T, -1, cfg.head_dim).transpose(1, 2)
        if _SDPA_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=cfg.n_rep > 1)
        else:
            k, v = k.repeat_interleave(cfg.n_rep, 1), v.repeat_interleave(cfg.n_rep, 1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return y.transpose(1, 2)  # [B, T, H, D]

    def _chunk(self, q, s: Step) -> torch.Tensor:
        # The H/Hkv query heads of a group are folded into the query axis, [B, Hkv, n_rep*T, D],
        # so one SDPA call reads each cached K/V once with no repeat_interleave copies.
        B, T, cfg = s.B, s.T, self.cfg
        kc = s.cache.k[self.layer][:, :, : s.kv_limit]  # [B, Hkv, S', D]
        vc = s.cache.v[self.layer][:, :, : s.kv_limit]
        qg = q.view(B, T, cfg.n_kv_heads, cfg.n_rep, cfg.head_dim).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(B, cfg.n_kv_heads, cfg.n_rep * T, cfg.head_dim)
        keys = torch.arange(kc.shape[2], device=q.device)
        mask = keys.view(1, 1, -1) <= s.positions.unsqueeze(-1)  # [B, T, S']
        mask = mask.unsqueeze(1).expand(B, cfg.n_rep, T, -1).reshape(B, 1, cfg.n_rep * T, -1)
        y = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask, scale=self.scale)
        return y.view(B, cfg.n_kv_heads, cfg.n_rep, T, cfg.head_dim).permute(0, 3, 1, 2, 4)  # [B, T, H, D]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # [gate | up]
        self.w_down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, s: Step) -> torch.Tensor:
        return self.w_down(s.ops.silu_mul(self.w_gate_up(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.ops = ops_mod.torch_ops("not yet placed on a device")
        self.cos = self.sin = None
        self.path = None  # the folder it was loaded from
        self.eos_ids: tuple[int, ...] = cfg.eos_token_ids

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (a tied head is the embedding, read once)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def use_ops(self, ops: ops_mod.OpSet) -> None:
        """Fix the kernel-or-twin choice; callers re-capture any CUDA graph afterwards."""
        self.ops = ops

    def ensure_rope(self, n_positions: int) -> None:
        if self.cos is not None and self.cos.shape[0] >= n_positions:
            return
        inv = rope_inv_freq(self.config).to(self.device)
        angles = torch.outer(torch.arange(n_positions, device=self.device, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos(), angles.sin()  # [max_pos, D/2] fp32

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return (F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)).float()

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        mode: str,
        lengths: torch.Tensor | None = None,
        kv_limit: int | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """tokens: [B, T] -> float32 logits [B, T, V] ([B, V] with last_only).

        prefill: lengths [B] gives each right-padded row's real length (default T); last_only picks each
        row's last real token. decode / chunk: appended at cache.seq_lens, which grows by T."""
        B, T = tokens.shape
        arange = torch.arange(T, device=tokens.device)
        if mode == "prefill":
            positions = arange.expand(B, T)
            lengths = torch.full((B,), T, device=tokens.device) if lengths is None else lengths
            cache.seq_lens.copy_(lengths)
        else:
            positions = cache.seq_lens.long().unsqueeze(1) + arange  # [B, T]
            cache.seq_lens.add_(T)
        s = Step(mode, B, T, positions, cache.seq_lens, cache, kv_limit or cache.max_seq_len, self.ops,
                 self.cos, self.sin)
        layers = self.layers
        h = self.embed(tokens).reshape(B * T, -1)  # residual stream: [N, C]
        x = self.ops.rmsnorm(h, layers[0].attn_norm.weight, self.config.rms_eps)
        for i, block in enumerate(layers):
            x = self.ops.add_rmsnorm(block.attn(x, s), h, block.mlp_norm.weight, self.config.rms_eps)
            nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else self.norm
            x = self.ops.add_rmsnorm(block.mlp(x, s), h, nxt.weight, self.config.rms_eps)
        x = x.view(B, T, -1)
        if last_only:
            x = x[torch.arange(B, device=x.device), lengths.long() - 1] if mode == "prefill" else x[:, -1]
        return self.head(x)
