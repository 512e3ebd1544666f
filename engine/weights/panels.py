"""The CPU kernels' panel layout (csrc/cpu/gemm.h), what the formats' panel packers share.

The CPU kernels stream weights in panels of 16 outputs (one 512-bit register of fp32 results), the 16
outputs' weights for each input side by side; P = ceil(out / 16) panels, the padded outputs all zero (and
never written by the kernels). Each format's module says how its values sit inside a panel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.weights.format import BLOCK

PANEL = 16


def pad_blocks(w: torch.Tensor) -> torch.Tensor:
    """[out, in] -> fp32 [out, nb, 32], zero-padded to whole blocks (what a quantizer reads)."""
    return F.pad(w.float(), (0, -w.shape[1] % BLOCK)).view(w.shape[0], -1, BLOCK)


def pad_outputs(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [P * 16, ...], the new rows zero."""
    pad = -t.shape[0] % PANEL
    return torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) if pad else t


def scales(s: torch.Tensor) -> torch.Tensor:
    """Per-block scales [out, nb] -> [P, nb, 16]."""
    s = pad_outputs(s)
    return s.view(s.shape[0] // PANEL, PANEL, s.shape[1]).transpose(1, 2).contiguous()


def unscales(s: torch.Tensor, out: int) -> torch.Tensor:
    """The inverse of scales."""
    return s.transpose(1, 2).reshape(-1, s.shape[1])[:out].contiguous()


def lane_scales(s: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of panelled scales [P, nb, 16] -> [n, nb]."""
    return s[ids // PANEL, :, ids % PANEL]


def check(fmt: str, out: int, n_in: int, tensors: tuple[torch.Tensor, ...], lead: tuple[int, ...],
          n_scales: int) -> None:
    """A format's panel tensors for [out, in] are (values shaped `lead`, then n_scales of [P, nb, 16])."""
    if len(tensors) != 1 + n_scales:
        raise ValueError(f"{fmt} panels are {1 + n_scales} tensor(s), got {len(tensors)}")
    if tuple(tensors[0].shape) != lead:
        raise ValueError(f"{fmt} panels for [{out}, {n_in}] must be {list(lead)}, got {list(tensors[0].shape)}")
    want = (-(-out // PANEL), -(-n_in // BLOCK), PANEL)
    for s in tensors[1:]:
        if tuple(s.shape) != want:
            raise ValueError(f"{fmt} scales for [{out}, {n_in}] must be {list(want)}, got {list(s.shape)}")
