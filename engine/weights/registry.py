"""Every weight format by name, and the operations every format has, dispatched through its record."""
from __future__ import annotations

import dataclasses

import torch

from engine.weights import dense, k_quants, q4_0, q4_1, q8_0
from engine.weights.format import Blocks, Packed, Stacked, WeightFormat

REGISTRY: dict[str, WeightFormat] = {f.name: f for f in (*dense.FORMATS, *q8_0.FORMATS, *q4_1.FORMATS, *q4_0.FORMATS,
                                                         *k_quants.FORMATS)}

FORMATS = tuple(name for name, f in REGISTRY.items() if f.pickable)  # what a user picks
QUANTIZED = tuple(name for name, f in REGISTRY.items() if f.quantized)
DENSE_DTYPES = {name: f.dtype for name, f in REGISTRY.items() if f.dtype is not None}
BITS = {name: f.bits for name, f in REGISTRY.items()}
PANEL_FORMATS = tuple(name for name, f in REGISTRY.items() if "cpu" in f.layouts)  # the CPU kernels run these
# GGUF type name -> the format holding its blocks as they are (Q8_0: int8, the one a user picks)
BY_GGUF = {f.gguf: name for name, f in reversed(REGISTRY.items()) if f.gguf and f.from_gguf}


def get(fmt: str) -> WeightFormat:
    if fmt not in REGISTRY:
        raise ValueError(f"weights={fmt!r} is not one of {', '.join(FORMATS)}")
    return REGISTRY[fmt]


def check_format(fmt: str) -> str:
    """A format a user may pick, or a ValueError naming the ones there are."""
    if fmt not in FORMATS:
        raise ValueError(f"weights={fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt


def quantize(w: torch.Tensor, fmt: str) -> Blocks:
    """w [out, in] (any float dtype) -> Blocks in `fmt`."""
    return get(fmt).quantize(w)


def dequantize(b: Blocks) -> torch.Tensor:
    """Blocks -> the fp32 weight [out, in] the format stands for (the twin of every kernel's weight read)."""
    return REGISTRY[b.fmt].dequantize(b)


def reblock(b: Blocks, fmt: str) -> Blocks | None:
    """b's weights as Blocks of `fmt` exactly (the same blocks, or ones that hold them: WeightFormat.exact_in),
    or None where `fmt` would round them again."""
    if b.fmt == fmt:
        return b
    return dataclasses.replace(b, fmt=fmt) if fmt in get(b.fmt).exact_in else None


def layout(fmt: str, name: str):
    f = get(fmt)
    if name not in f.layouts:
        kind = {"cpu": "the CPU kernels", "cuda": "the CUDA kernels"}.get(name, f"the {name} path")
        runs = [n for n in FORMATS if name in REGISTRY[n].layouts]
        raise ValueError(f"{kind} have no layout for {fmt!r}; they take {', '.join(runs)}")
    return f.layouts[name]


def pack(b: Blocks, name: str) -> Packed:
    return Packed(b.fmt, name, b.out_features, b.in_features, layout(b.fmt, name).pack(b))


def stack(segments: list[Packed]) -> Packed | Stacked:
    """Packed weights of one layout as one weight, their outputs in order (a single one as it is)."""
    if len({s.layout for s in segments}) != 1 or len({s.in_features for s in segments}) != 1:
        raise ValueError(f"stacked segments share a layout and their inputs, got "
                         f"{[(s.layout, s.in_features) for s in segments]}")
    return segments[0] if len(segments) == 1 else Stacked(tuple(segments))


def to_device(w: Packed | Stacked, device: torch.device) -> Packed | Stacked:
    """w with every tensor on `device`: a load packs a file's bytes in host memory, then places each weight."""
    return stack([dataclasses.replace(s, tensors=tuple(t.to(device) for t in s.tensors)) for s in w.segments])


def place(w: Packed | Stacked, name: str) -> Packed | Stacked:
    """w in layout `name`, each segment repacked from its Blocks (exact: switching paths never changes a weight)."""
    if w.layout == name:
        return w
    return stack([pack(unpack(s), name) for s in w.segments])


def unpack(p: Packed) -> Blocks:
    """The inverse of pack: exact, so switching paths never changes a weight."""
    return layout(p.fmt, p.layout).unpack(p.fmt, p.out_features, p.in_features, p.tensors)


def rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    """Output rows `ids` of the weight, dequantized: [len(ids), in] fp32 (a tied embedding's lookup)."""
    return layout(p.fmt, p.layout).rows(p, ids)


def to_panels(b: Blocks) -> tuple[torch.Tensor, ...]:
    """Blocks -> the tensors the CPU kernel of its format takes after x and out."""
    return layout(b.fmt, "cpu").pack(b)


def from_panels(fmt: str, out_features: int, in_features: int, *tensors: torch.Tensor) -> Blocks:
    """The inverse of to_panels."""
    return layout(fmt, "cpu").unpack(fmt, out_features, in_features, tensors)
