"""The five math ops the model runs, and the one place the kernel-or-twin choice is made.

`select(device, fused=True)` returns an OpSet; the model holds it from construction on, so every call
(and every captured CUDA graph) runs one fixed path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine.ops import ref


@dataclass(frozen=True)
class OpSet:
    name: str  # "fused" or "torch"
    reason: str  # why this path: "fused CUDA kernels" or why they are not in use
    rmsnorm: Callable
    add_rmsnorm: Callable
    rope_: Callable
    silu_mul: Callable
    decode_attention: Callable


TORCH_OPS = dict(
    rmsnorm=ref.rmsnorm, add_rmsnorm=ref.add_rmsnorm, rope_=ref.rope_,
    silu_mul=ref.silu_mul, decode_attention=ref.decode_attention,
)


def torch_ops(reason: str) -> OpSet:
    return OpSet(name="torch", reason=reason, **TORCH_OPS)


# the head sizes the decode-attention kernel is instantiated for (csrc/kernels.cu)
FUSED_HEAD_DIMS = (64, 128)


def select(device: torch.device | str, fused: bool = True, head_dim: int | None = None) -> OpSet:
    """Fused kernels where they can run, else the torch twins with the reason recorded."""
    device = torch.device(device)
    if not fused:
        return torch_ops("fused kernels switched off")
    if device.type != "cuda":
        return torch_ops(f"no CUDA device (running on {device.type})")
    if head_dim is not None and head_dim not in FUSED_HEAD_DIMS:
        return torch_ops(f"the fused decode attention is built for head_dim {FUSED_HEAD_DIMS}; this model has {head_dim}")
    from engine import ext

    status = ext.load("cuda")
    if status.module is None:
        return torch_ops(status.reason)
    from engine.ops import fused as fused_ops

    return OpSet(name="fused", reason=status.reason, **fused_ops.ops(status.module))
