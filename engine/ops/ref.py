"""Plain torch twins of the fused kernels: the CPU path and the test oracle.

Each twin has the signature of its kernel wrapper in fused.py and the same recipe: upcast to fp32, the
formula, cast back. Shapes: N tokens (B*T flattened), H query heads, Hkv kv heads, D head_dim,
S the cache's max length, I the MLP's intermediate size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    # x: [N, hidden], weight: [hidden]; F.rms_norm is x * rsqrt(mean(x^2) + eps) * weight in one call
    y = F.rms_norm(x.float(), x.shape[-1:], weight.float(), eps).to(x.dtype)
    if out is None:
        return y
    return out.copy_(y)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x (in place), then returns rmsnorm(residual) written into x.

    The sum is rounded to the residual's dtype before the norm, as an unfused add then norm would."""
    residual.add_(x)
    return rmsnorm(residual, weight, eps, out=x)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotary embedding in place, HF llama's half-rotation layout.

    q: [N, H, D], k: [N, Hkv, D], cos/sin: [max_pos, D/2] fp32, positions: [N] int (device memory)."""
    c = cos[positions].unsqueeze(1)  # [N, 1, D/2]
    s = sin[positions].unsqueeze(1)
    for x in (q, k):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up]: [N, 2I] -> [N, I]."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    y = (F.silu(gate) * up).to(gate_up.dtype)
    if out is None:
        return y
    return out.copy_(y)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per row against its cache; keys j >= seq_lens[b] are masked.

    q: [B, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32 -> [B, H, D].
    GQA by a view: the H/Hkv query heads of a group share one K/V, no copies of the cache."""
    B, H, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    qg = q.float().view(B, Hkv, H // Hkv, D)
    scores = torch.matmul(qg, k_cache.float().transpose(-1, -2)) * scale  # [B, Hkv, n_rep, S]
    live = torch.arange(S, device=q.device) < seq_lens.view(B, 1, 1, 1)
    scores = scores.masked_fill(~live, float("-inf"))
    y = torch.matmul(scores.softmax(-1), v_cache.float()).view(B, H, D).to(q.dtype)
    if out is None:
        return y
    return out.copy_(y)
