"""Which weight format each projection loads in, and the notes that say so wherever a file's blocks are not run
as they are.

A load asks for a format (weights="q4"), or leaves it to the file: then each tensor runs its own blocks where a
kernel of this path runs their format (Q4_1: q4_a8 on a CPU, q4 on CUDA; Q8_0: int8; the K-quants, Q4_0, Q5_0, Q5_1 on a
CPU), as llama.cpp runs them (on a CPU against 8-bit activation blocks, FILE_RECIPE), else in a format
that holds them exactly (Q5_0 / Q4_0 are int8 blocks), else in a stand-in: the smallest format this path runs with
at least their bits per weight (Q6_K -> int8 on CUDA), re-quantized from one tensor's dequantized rows at a time: a
second rounding, and a note names the tensors, their type and the choice. A merged projection (q/k/v, gate/up)
whose parts differ in format (a Q4_K_M file's Q4_K q and k, its Q6_K v) is stacked (weights.Stacked): each run of
parts in one format is a segment of its own, so no part is rounded again to match another. Dense tensors (F32,
F16, BF16, an HF folder's) run in the activations' dtype, but on the CPU kernels a 16-bit one keeps its own
(KEPT_DENSE). Every choice is made before a byte is read, so the memory a load needs is known before it starts
(load.py checks it).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from itertools import groupby

import torch

from engine import ops
from engine import weights as wts
from engine.weights import panels
from engine.checkpoint.hf import ModelLoadError

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


def pick_format(weights: str | None, dtype: torch.dtype, opset: ops.OpSet) -> str:
    """The projections' format as asked (refused where this path has no kernel for it), else the activations'
    dtype's (FormatPlan chooses a file's own)."""
    if weights is None:
        return DENSE[dtype]
    fmt = check_format_name(weights)
    if not runs(fmt, opset):
        where = {"cpu": "CPU", "cuda": "CUDA"}[opset.layout]
        have = [f for f in wts.FORMATS if runs(f, opset)]
        raise ModelLoadError(f"weights={fmt!r} has no {where} kernel; its torch twin runs it with fused=False "
                             f"(--no-fused), or pick one of {', '.join(have)}")
    return fmt


def holds(fmt: str, stored: str) -> bool:
    """Whether Blocks of `fmt` hold a file's blocks of format `stored` exactly (engine/weights: reblock)."""
    return stored == fmt or fmt in wts.get(stored).exact_in


def q4_0_as_q4(b: wts.Blocks) -> wts.Blocks:
    """Q4_0's d * q (q in -8..7) is Q4_1's d * (q + 8) - 8d: the same values (8d is exact in fp16)."""
    return wts.Blocks("q4", b.out_features, b.in_features, (b.q.to(torch.int16) + 8).to(torch.uint8), b.d,
                      (b.d.float() * -8).half())


def q4_k_as_q4(b: wts.Blocks) -> wts.Blocks:
    """Q4_K's sub-blocks of 32 (d*sc * q - dmin*mn, q in 0..15) as Q4_1 blocks with the same q: only each
    sub-block's step d*sc and offset dmin*mn are rounded to fp16, at most 2^-11 of themselves."""
    out, nb = b.out_features, -(-b.in_features // wts.BLOCK)
    ns = b.d.shape[1]
    step = (b.d.float()[..., None] * b.sc.float().view(out, ns, -1)).view(out, -1)[:, :nb]
    offset = (b.m.float()[..., None] * b.mn.float().view(out, ns, -1)).view(out, -1)[:, :nb]
    return wts.Blocks("q4", out, b.in_features, b.q[:, :nb * wts.BLOCK].contiguous(), step.half(), (-offset).half())


# (a file's format, a format this path runs) -> (the conversion of its Blocks, what it rounds or None if exact):
# cheaper and closer than re-quantizing the dequantized values
CONVERSIONS = {("q4_0", "q4"): (q4_0_as_q4, None),
               ("q4_k", "q4"): (q4_k_as_q4, "their sub-block scales rounded to fp16 (at most 2^-11 of a step)")}
# q4_a8 holds q4's blocks (engine/weights/q4_1.py), so it takes the same conversions
CONVERSIONS |= {(stored, "q4_a8"): (lambda b, convert=convert: wts.reblock(convert(b), "q4_a8"), rounds)
                for (stored, _), (convert, rounds) in list(CONVERSIONS.items())}


def near(fmt: str, stored: str) -> bool:
    """Whether `fmt` takes a file's `stored` blocks as they are or by a conversion (CONVERSIONS)."""
    return holds(fmt, stored) or (stored, fmt) in CONVERSIONS


# A file's Q4_1 blocks on a CPU run as q4_a8, llama.cpp's recipe for them (8-bit activation blocks, Q8_1), as every
# other GGUF block format here already does: measured on the default model's file (bench/results/quality-cpu-zen4,
# bench/kld.py) its distance from the exact model equals llama.cpp's own run of the file (KL divergence 0.0026 /
# 0.0033 against llama.cpp's 0.0025 / 0.0034 on prose / docs and code, top-1 96.6% / 96.1% against 96.1% / 96.3%),
# and its verify pass does half of q4's integer work (a 6-token pass 1.5 steps against 2.0 on a Zen 4), so drafts
# pay. weights="q4" keeps the file's exact values (16-bit activations: logits within 0.01 of the fp32 model's).
FILE_RECIPE = {("cpu", "q4"): "q4_a8"}  # (device type, the file's format) -> the format it runs in
# A file's dense matrices on the CPU kernels keep their dtype (a GGUF's F16 / BF16 tensors, an HF folder's float16 /
# bfloat16 safetensors), as llama.cpp runs F16 and BF16: the kernels widen each weight to fp32 as they read it,
# exactly, so the logits are the bits of its fp32 widening at half the bytes. On the twins and on CUDA a dense
# tensor runs in the activations' dtype.
KEPT_DENSE = {"F16": "fp16", "BF16": "bf16"}


def stand_in_order(fmt: str) -> tuple:
    """Among formats that would do: fewer bits first, then one a user may pick (int8 before q8)."""
    f = wts.get(fmt)
    return f.bits, not f.pickable


def stored_format(src, name: str) -> str | None:
    """The weight format holding tensor `name`'s blocks as the file stores them; None for a dense tensor."""
    return wts.BY_GGUF.get(src.gguf_type(name))


class FormatPlan:
    """The format of every tensor of one load's projections, chosen before a byte is read, and the notes on what
    the loader had to do to a file's blocks. targets: {our parameter: (its HF tensors, [out, in], is the head)};
    device: the device type the weights load onto (FILE_RECIPE)."""

    def __init__(self, weights: str | None, dtype: torch.dtype, opset: ops.OpSet, src, targets: dict, device: str):
        self.asked, self.dense, self.opset, self.src, self.device = weights, DENSE[dtype], opset, src, device
        self.noted: dict[str, list[str]] = defaultdict(list)  # why -> the GGUF tensors it applies to
        self.here = [f for f in wts.QUANTIZED if runs(f, opset)]
        self.targets = targets
        self.choice: dict[str, str] = {}  # HF tensor -> its format
        if weights is not None:
            self.fmt = pick_format(weights, dtype, opset)
            for names, _, head in targets.values():
                self.choice |= {n: head_format(self.fmt) if head else self.fmt for n in names}
        else:
            for names, _, head in targets.values():
                self.choice |= {n: self.own(n) for n in names if not head}
            layers = Counter(f for ours in targets if ours.startswith("layers.") for f in self.formats(ours))
            self.fmt = layers.most_common(1)[0][0] if layers else self.dense
            for names, _, head in targets.values():
                self.choice |= {n: self.own(n, prefer=head_format(self.fmt)) for n in names if head}

    def own(self, name: str, prefer: str | None = None) -> str:
        """The format the file's own blocks of tensor `name` run in on this path."""
        stored = stored_format(self.src, name)
        if stored is None:
            return self.kept_dense(name) or self.dense
        if prefer in self.here and near(prefer, stored):
            return prefer
        recipe = FILE_RECIPE.get((self.device, stored))
        if recipe in self.here:
            return recipe
        if stored in self.here:
            return stored
        exact = [f for f in self.here if near(f, stored)]
        if exact:
            return min(exact, key=stand_in_order)
        fits = [f for f in self.here if wts.get(f).bits >= wts.get(stored).bits]
        return min(fits, key=lambda f: (f != prefer, *stand_in_order(f))) if fits else self.dense

    def kept_dense(self, name: str) -> str | None:
        """The format dense tensor `name` keeps its file's dtype in on the CPU kernels (KEPT_DENSE), else None."""
        if self.opset.layout != "cpu" or self.dense != "fp32":
            return None
        return KEPT_DENSE.get(self.src.dense_type(name))

    def formats(self, ours: str) -> list[str]:
        """The format of each HF tensor of our parameter, in order."""
        return [self.choice[n] for n in self.targets[ours][0]]

    def weight(self, ours: str, names: list[str], n_in: int) -> wts.Packed | wts.Stacked:
        """The weight made of HF tensors `names` (concatenated, dim 0) packed in its formats' layouts for this path:
        one segment per run of tensors in one format (weights.stack)."""
        runs = groupby(names, key=self.choice.__getitem__)
        return wts.stack([self.segment(fmt, list(part), n_in) for fmt, part in runs])

    def segment(self, fmt: str, names: list[str], n_in: int) -> wts.Packed:
        """HF tensors `names` in one format. A layout that packs GGUF bytes itself takes the file's rows as they
        are, a chunk at a time (the packed weight is the only copy made); on a CPU every other load is packed a
        run of whole panels at a time too: dense values (or a file's blocks dequantized for a dense format)
        quantized run by run, a file's blocks in another block format converted chunk by chunk. Else (a CUDA
        layout, a merged projection mixing dense and block parts) the canonical Blocks of every part are
        concatenated and packed."""
        src, f = self.src, wts.get(fmt)
        layout, cpu = f.layouts[self.opset.layout], self.opset.layout == "cpu"
        rows = sum(src.shapes[n][0] for n in names)
        stored = [stored_format(src, n) for n in names]
        if f.gguf and layout.pack_gguf is not None and all(src.gguf_type(n) == f.gguf for n in names):
            chunks = (chunk for n in names for chunk in src.raw_chunks(n))
            return wts.Packed(fmt, self.opset.layout, rows, n_in, layout.pack_gguf(chunks, rows, n_in))
        if cpu and (f.dtype is not None or all(s is None for s in stored)):
            # dense values (safetensors, a GGUF's F32 / F16, a file's blocks for a dense format): quantized and
            # packed a chunk of rows at a time, so the tensor is never in memory whole in its file's dtype, nor in
            # fp32 (a 0.5B's tied head was 1.8 GB of transients in q8)
            chunks = (chunk for n in names for chunk in self.value_chunks(n, fmt, n_in))
            pack = ((lambda x: (panels.dense_view(x.to(f.dtype)),)) if f.dtype is not None  # a dense format's panels
                    else (lambda x: layout.pack(wts.quantize(x, fmt))))
            return wts.Packed(fmt, self.opset.layout, rows, n_in, panels.pack_runs(chunks, rows, n_in, 1, 1, pack))
        if cpu and None not in stored:
            # a file's blocks in another block format (weights= asked, or a stand-in): converted and packed a chunk
            # of rows at a time, so a part is never whole in Blocks or fp32 (a 1.5B Q4_K_M's tied Q6_K head in q4
            # was 678 MB of transients)
            chunks = (b for n in names for b in self.converted(n, fmt, n_in, src.raw_chunks(n)))
            packed = panels.fill(panels.block_runs(chunks), rows, layout.pack)
            return wts.Packed(fmt, self.opset.layout, rows, n_in, packed)
        parts = [self.part(n, fmt, n_in) for n in names]
        return wts.pack(parts[0] if len(parts) == 1 else wts.Blocks.cat(parts), self.opset.layout)

    def part(self, name: str, fmt: str, n_in: int) -> wts.Blocks:
        if stored_format(self.src, name) is None:
            return wts.quantize(self.src.dense(name), fmt)
        chunks = (raw.clone() for raw in self.src.raw_chunks(name))  # raw_chunks reuses its buffer; these are kept
        return wts.Blocks.cat(list(self.converted(name, fmt, n_in, chunks)))

    def converted(self, name: str, fmt: str, n_in: int, chunks):
        """Tensor `name`'s blocks as Blocks of `fmt`, one per chunk of its rows as the file stores them (uint8
        [rows, row bytes]): as they are, converted (CONVERSIONS), or re-quantized from their values. Every format
        keeps its rows apart, so the chunks' Blocks are the whole tensor's rows."""
        stored = stored_format(self.src, name)
        self.note_conversion(name, stored, fmt)
        for raw in chunks:
            b = wts.get(stored).from_gguf(raw, raw.shape[0], n_in)
            if holds(fmt, stored):
                yield wts.reblock(b, fmt)
            elif (stored, fmt) in CONVERSIONS:
                yield CONVERSIONS[stored, fmt][0](b)
            else:
                yield wts.quantize(wts.dequantize(b), fmt)

    def value_chunks(self, name: str, fmt: str, n_in: int):
        """Tensor `name`'s values a chunk of rows at a time: a dense tensor's from the file, a block tensor's
        dequantized (for a dense format)."""
        stored = stored_format(self.src, name)
        if stored is None:
            yield from self.src.dense_chunks(name)
            return
        self.note_conversion(name, stored, fmt)
        for raw in self.src.raw_chunks(name):
            yield wts.dequantize(wts.get(stored).from_gguf(raw, raw.shape[0], n_in))

    def note_conversion(self, name: str, stored: str, fmt: str) -> None:
        """Note what running tensor `name`'s `stored` blocks as `fmt` rounds, and why it was done."""
        where = self.opset.layout.upper()
        if holds(fmt, stored):
            return
        if (stored, fmt) in CONVERSIONS:
            rounds = CONVERSIONS[stored, fmt][1]
            why = rounds and (f"converted to {fmt} blocks (weights={self.asked!r}), {rounds}" if self.asked else
                              f"run as {fmt} blocks, {rounds}: the {where} kernels do not run {stored} blocks yet")
        elif wts.get(fmt).quantized:
            why = (f"re-quantized to {fmt} from their dequantized values (weights={self.asked!r}): a second rounding"
                   if self.asked else f"run as {fmt} blocks re-quantized from their dequantized values, a second "
                   f"rounding: the {where} kernels do not run {stored} blocks yet")
        else:
            why = None if self.asked else f"dequantized to {fmt}: no {where} kernel holds their blocks"
        if why:
            self.note([name], why)

    def values(self, names: list[str]) -> torch.Tensor:
        """The fp32 values of HF tensors `names`, concatenated (norms, biases, a dense embedding)."""
        parts = []
        for n in names:
            stored = stored_format(self.src, n)
            if stored is None:
                parts.append(self.src.dense(n).float())
            else:
                raw = self.src.raw(n)
                parts.append(torch.cat(list(dequantized_rows(raw, stored, self.src.shapes[n][-1]))))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def nbytes(self, ours: str, shape: tuple[int, int]) -> int:
        return sum(wts.get(self.choice[n]).nbytes(self.src.shapes[n][0], shape[1]) for n in self.targets[ours][0])

    def note(self, names: list[str], why: str) -> None:
        self.noted[why] += [f"{self.src.gguf_name(n)} ({self.src.gguf_type(n)})" for n in names]

    def messages(self) -> list[str]:
        return [f"decodescope: {len(names)} tensors {why}: {compress(names)}" for why, names in self.noted.items()]


ROWS_AT_ONCE = 1 << 22  # weights per dequantized slice: 16 MB of fp32, whatever the tensor's size


def dequantized_rows(raw: torch.Tensor, stored: str, n_in: int):
    """A block tensor's fp32 rows [n, in], a slice at a time: no tensor ever exists whole in fp32."""
    f = wts.get(stored)
    step = max(1, ROWS_AT_ONCE // n_in)
    for i in range(0, raw.shape[0], step):
        chunk = raw[i:i + step]
        yield wts.dequantize(f.from_gguf(chunk, chunk.shape[0], n_in))


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
