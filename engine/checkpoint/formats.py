"""Which weight format each projection loads in, and the notes that say so where a file's blocks are not kept.

A load asks for a format (weights="q4"), or leaves it to the model: then a converted GGUF file runs its own blocks
in the format that holds most of them exactly where kernels run (SmolLM2's Q4_1: q4; Gemma 3's Q5_0 / Q8_0: int8),
and any other folder its dtype's dense format. A tensor whose blocks that format cannot hold (a Q6_K tensor in a
load that runs q4_k) is dequantized, or re-quantized where a quantized format was asked for; either way a note
names the tensors, their type and the choice: never a silent second rounding.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import torch

from engine import ops
from engine import weights as wts
from engine.checkpoint.hf import KeptBlocks, ModelLoadError

DENSE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def check_format_name(weights: str) -> str:
    try:
        return wts.check_format(weights)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def head_format(fmt: str) -> str:
    """The LM head's format: a q4 model keeps its head in 8-bit blocks, as the GGUF files of small models do
    (the default model's is Q8_0): the head sees every token's logits, where 4 bits cost the most quality. It
    runs as q8 (engine/weights/q8_0.py): those blocks against 16-bit activations on a CPU, as q4's own."""
    return wts.get(fmt).head or fmt


def runs(fmt: str, opset: ops.OpSet) -> bool:
    """Whether this OpSet's kernels run `fmt` (the torch twins run every format)."""
    return opset.layout in wts.get(fmt).layouts


def pick_format(weights: str | None, dtype: torch.dtype, opset: ops.OpSet, kept: KeptBlocks | None = None) -> str:
    """The projections' format: as asked (refused where this path has no kernel for it), else the file's own
    (native_format), else the activations' dtype."""
    if weights is None:
        return native_format(kept, opset) or DENSE[dtype]
    fmt = check_format_name(weights)
    if not runs(fmt, opset):
        where = {"cpu": "CPU", "cuda": "CUDA"}[opset.layout]
        have = [f for f in wts.FORMATS if runs(f, opset)]
        raise ModelLoadError(f"weights={fmt!r} has no {where} kernel; its torch twin runs it with fused=False "
                             f"(--no-fused), or pick one of {', '.join(have)}")
    return fmt


def native_format(kept: KeptBlocks | None, opset: ops.OpSet) -> str | None:
    """The format a user may pick that holds most of a converted GGUF's block-typed projections exactly where
    this OpSet's kernels run them; None where there is none (no blocks, or the torch twins: dense runs faster)."""
    if kept is None or opset.name != "fused":
        return None
    counts = Counter()
    for name in kept.types:
        stored = kept.stored_format(name)
        if stored is None or not name.startswith("model.layers."):  # the head follows head_format
            continue
        for f in (stored, *wts.get(stored).exact_in):
            if wts.get(f).pickable and runs(f, opset):
                counts[f] += 1
    order = list(wts.REGISTRY)  # a tie goes to the format listed first (int8 before the 4-6 bit ones)
    return max(counts, key=lambda f: (counts[f], -order.index(f))) if counts else None


class FormatPlan:
    """The format of every projection of one load, the blocks it keeps, and the notes on those it does not."""

    def __init__(self, weights: str | None, dtype: torch.dtype, opset: ops.OpSet, kept: KeptBlocks):
        self.asked, self.dense, self.opset, self.kept = weights, DENSE[dtype], opset, kept
        self.fmt = pick_format(weights, dtype, opset, kept)
        self.noted: dict[str, list[str]] = defaultdict(list)  # why -> the GGUF tensors it applies to

    def blocks(self, names: list[str], n_in: int, head: bool, dense) -> wts.Blocks:
        """The weight made of HF tensors `names` (concatenated) in its format: the file's blocks where the format
        holds them, else quantized from dense() (the fp32 tensors, [out, in]), noted where the file had blocks."""
        fmt = head_format(self.fmt) if head else self.fmt
        kept = self.kept.blocks(names, fmt, n_in)
        if kept is not None:
            return kept
        blocked = [n for n in names if self.kept.block_typed(n)]
        if self.asked is None:  # the file's own format cannot hold these: dense, exactly
            own = [self.kept.stored_format(n) for n in blocked]
            alone = [s is not None and any(runs(f, self.opset) for f in (s, *wts.get(s).exact_in)) for s in own]
            types = sorted({self.kept.gguf_type(n) for n in blocked})
            if blocked and self.opset.name == "fused" and all(alone) and len(types) > 1:  # each runs, not in one
                self.note(blocked, f"dequantized to {self.dense}: fused into one matrix from parts in different block "
                                   f"types ({', '.join(types)}), which no one format holds exactly")
            elif blocked and self.opset.name == "fused" and all(alone):
                self.note(blocked, f"dequantized to {self.dense}: their blocks have a kernel, but this load runs every "
                                   f"projection in one format ({self.fmt}), which does not hold them")
            elif blocked and self.opset.name == "fused":
                self.note(blocked, f"dequantized to {self.dense}: the {self.opset.layout.upper()} kernels have no "
                                   "kernel for their blocks yet")
            elif blocked:
                self.note(blocked, f"dequantized to {self.dense}: the torch twins run dense weights unless weights= "
                                   "names a format")
            fmt = self.dense
        elif blocked and wts.get(fmt).quantized:
            self.note(blocked, f"re-quantized to {fmt} from their dequantized values (weights={self.asked!r}): a "
                               "second rounding")
        return wts.quantize(dense(), fmt)

    def note(self, names: list[str], why: str) -> None:
        self.noted[why] += [f"{self.kept.gguf_name(n)} ({self.kept.gguf_type(n)})" for n in names]

    def messages(self) -> list[str]:
        return [f"decodescope: {len(names)} tensors {why}: {compress(names)}" for why, names in self.noted.items()]


def compress(names: list[str]) -> str:
    """'blk.0.attn_output.weight (Q4_K)', 'blk.1.attn_output.weight (Q4_K)' -> 'blk.{0-1}.attn_output.weight
    (Q4_K)': one entry per tensor kind, with its blocks' range."""
    kinds: dict[str, list[int]] = defaultdict(list)
    for n in names:
        parts = n.split(".", 2)
        if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
            kinds[parts[2]].append(int(parts[1]))
        else:
            kinds[n] = []
    out = []
    for kind, layers in kinds.items():
        if not layers:
            out.append(kind)
            continue
        spans, start = [], layers[0]
        for a, b in zip(layers, [*layers[1:], None], strict=True):
            if b != a + 1:
                spans.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        out.append(f"blk.{{{','.join(spans)}}}.{kind}")
    return ", ".join(out)
