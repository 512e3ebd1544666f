"""The row-wise ops (norms, rope, silu * up) over a compiled module: the CUDA module (csrc/) and the CPU one
(csrc/cpu/) register these names with the same argument orders, so one set of wrappers serves both."""
from __future__ import annotations

from types import ModuleType

import torch


class RowwiseOps:
    """The row-wise ops over a compiled module; the CUDA module (csrc/) and the CPU one (csrc/cpu/) share
    these names and argument orders."""

    def __init__(self, module: ModuleType):
        self.module = module

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
        return self._gated(self.module.silu_mul, gate_up, out)

    def _gated(self, kernel, gate_up: torch.Tensor, out: torch.Tensor | None):
        if out is None:
            assert gate_up.shape[-1] % 2 == 0, gate_up.shape
            out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
        kernel(out, gate_up)
        return out
