"""What a weight format is: canonical Blocks, the layouts a path streams, and the record that names them.

`Blocks` is the canonical, layout-free form of one weight [out, in] in a format: a GGUF file's blocks load
into it unchanged, so a format that matches the file's is lossless. `Packed` is the same weight in the layout
one path streams (LAYOUTS), packed from Blocks once at load; `Stacked` is a weight whose output rows are Packed
segments in different formats (a merged projection whose parts the file stores in different types). A
`WeightFormat` record holds everything about one format (the way ggml's type_traits does): its size, how a weight
becomes Blocks, the dequantize twin every kernel is tested against, the layouts it has and what its CPU kernel
does with the activations. Every table
of formats in the engine, the app and the benchmarks reads these records (engine/weights/registry.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

BLOCK = 32  # inputs per quantization block, as in GGUF's Q8_0 and Q4_1

# "torch"  the torch twins: dense formats as W^T [in, out] (on a CPU, MKL's vector-times-matrix path streams
#          that layout about twice as fast as F.linear's [out, in]), quantized formats as canonical Blocks
#          (the twin dequantizes them per call)
# "cuda"   fp32 as "torch" (cuBLAS); fp16, bf16 and quantized formats as rows the GEMV kernels read
# "cpu"    panels of 16 outputs for the SIMD kernels (csrc/cpu/gemm.h)
LAYOUTS = ("torch", "cuda", "cpu")


@dataclass
class Blocks:
    """One weight [out, in] in a format, canonical layout.

    dense formats: q is the weight [out, in] in the format's dtype; d and m are None.
    block formats: q holds one integer per weight [out, in_pad], d (and m) one fp16 per block [out, nb];
    in_pad is `in` rounded up to a whole block, the padding zeros (contributing nothing).
    K-quants (super-blocks of 256): d and m one fp16 per super-block, sc (and mn) one small integer per
    sub-block [out, n_sub]: the sub-block's scale (and min) in units of d (and m)."""
    fmt: str
    out_features: int
    in_features: int
    q: torch.Tensor
    d: torch.Tensor | None = None
    m: torch.Tensor | None = None
    sc: torch.Tensor | None = None
    mn: torch.Tensor | None = None

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.fields().values())

    def fields(self) -> dict[str, torch.Tensor]:
        """The tensors by name; every one leads with the outputs."""
        return {k: t for k in ("q", "d", "m", "sc", "mn") if (t := getattr(self, k)) is not None}

    def rows(self, start: int, stop: int, copy: bool = False) -> Blocks:
        """Outputs start..stop, as views (or copies)."""
        return Blocks(self.fmt, stop - start, self.in_features,
                      **{k: t[start:stop].clone() if copy else t[start:stop] for k, t in self.fields().items()})

    @staticmethod
    def cat(parts: list[Blocks]) -> Blocks:
        """Blocks of one format stacked along the outputs."""
        fields = {k: torch.cat([p.fields()[k] for p in parts]) for k in parts[0].fields()}
        return Blocks(parts[0].fmt, sum(p.out_features for p in parts), parts[0].in_features, **fields)


@dataclass
class Packed:
    """A weight in the layout one path streams; `tensors` are what that path's matmul takes after x."""
    fmt: str
    layout: str
    out_features: int
    in_features: int
    tensors: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def segments(self) -> tuple[Packed, ...]:
        return (self,)


@dataclass
class Stacked:
    """One weight [out, in] whose output rows are segments in formats of their own, each a Packed weight of the same
    layout writing its slice of the outputs, in order: a GGUF file's merged parts that differ in format (Q4_K_M's q
    and k in Q4_K, its v in Q6_K) each run their own blocks with their own kernel, none rounded a second time."""
    segments: tuple[Packed, ...]

    @property
    def layout(self) -> str:
        return self.segments[0].layout

    @property
    def out_features(self) -> int:
        return sum(s.out_features for s in self.segments)

    @property
    def in_features(self) -> int:
        return self.segments[0].in_features

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)


@dataclass(frozen=True)
class Layout:
    """How Blocks become one path's tensors and back (exactly: switching paths never changes a weight), and
    how a few output rows come back dequantized without unpacking the rest (a tied embedding's lookup)."""
    pack: Callable[[Blocks], tuple[torch.Tensor, ...]]
    unpack: Callable[[str, int, int, tuple[torch.Tensor, ...]], Blocks]  # (fmt, out, in, tensors) -> Blocks
    rows: Callable[[Packed, torch.Tensor], torch.Tensor]  # (packed, ids [n]) -> [n, in] fp32
    # a GGUF tensor's bytes into this layout, a chunk of rows at a time (panels.runs), never the whole
    # tensor's Blocks: (raw uint8 [out, row bytes] as in the file, or its rows in chunks, out, in) -> the layout's
    # tensors; None where the loader goes through Blocks (the torch and CUDA layouts)
    pack_gguf: Callable[[torch.Tensor, int, int], tuple[torch.Tensor, ...]] | None = None


@dataclass(frozen=True)
class WeightFormat:
    name: str  # what load_model(weights=...), the app, the CLI and the benchmarks call it
    bits: float  # per weight, block scales and mins included
    block: int  # inputs per quantization block; 1 for a dense format
    quantize: Callable[[torch.Tensor], Blocks]  # a float weight [out, in] -> Blocks
    dequantize: Callable[[Blocks], torch.Tensor]  # Blocks -> the fp32 weight [out, in]: every kernel's twin
    layouts: dict[str, Layout]  # by LAYOUTS name; a path without one cannot run the format
    pickable: bool = True  # False: used inside a model only (q8, the head of a q4 model)
    dtype: torch.dtype | None = None  # a dense format's storage dtype
    # What the CPU kernel does with the activations (its torch twin does the same: engine/ops/ref.py):
    # "exact" keeps them fp32; "int8" quantizes them per block of 32 (W8A8, llama.cpp's Q8_0 recipe); "int16"
    # quantizes them per block of 32 to 16 bits (csrc/cpu/q16.h: exact integer sums, error ~2^-16 of a block's
    # largest value); "q8_k" quantizes them per super-block of 256 to int8 with the sums of every 16 (llama.cpp's
    # Q8_K, which the K-quants' mins fold in through)
    cpu_activations: str = "exact"
    head: str | None = None  # the format a model in this one keeps its LM head in (None: this one)
    cuda_kernel: str | None = None  # the CUDA module's GEMV for the format (csrc/cuda/gemv.cuh); None: cuBLAS
    gguf: str | None = None  # llama.cpp's name of the same type (GGMLQuantizationType): its blocks load unchanged
    # GGUF's bytes of the type <-> Blocks: (uint8 [out, bytes per row], out, in) -> Blocks, and back
    from_gguf: Callable[[torch.Tensor, int, int], Blocks] | None = None
    to_gguf: Callable[[Blocks], torch.Tensor] | None = None
    # formats whose Blocks hold this one's weights exactly, tensor for tensor (Q4_0's and Q5_0's small integers
    # and one fp16 scale per 32 inputs are Q8_0 blocks): a file's blocks load there without a second rounding
    exact_in: tuple[str, ...] = ()
    notes: str = ""  # one line for the app's and the README's format tables
    extra: dict = field(default_factory=dict)

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def nbytes(self, out_features: int, in_features: int) -> int:
        """Bytes one matrix-vector product reads for a weight [out, in] (scales and mins included)."""
        width = in_features if self.block == 1 else -(-in_features // self.block) * self.block
        return int(out_features * width * self.bits / 8)
