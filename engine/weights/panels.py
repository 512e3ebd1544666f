"""The CPU kernels' panel layout (csrc/cpu/gemm.h), what the formats' panel packers share.

The CPU kernels stream weights in panels of 16 outputs (one 512-bit register of fp32 results), the 16
outputs' weights for each input side by side; P = ceil(out / 16) panels, the padded outputs all zero (and
never written by the kernels). Each format's module says how its values sit inside a panel.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.weights.format import BLOCK, Blocks

PANEL = 16
WIDE = {4: torch.int32, 2: torch.int16, 1: torch.uint8}


def pad_blocks(w: torch.Tensor) -> torch.Tensor:
    """[out, in] -> fp32 [out, nb, 32], zero-padded to whole blocks (what a quantizer reads)."""
    return F.pad(w.float(), (0, -w.shape[1] % BLOCK)).view(w.shape[0], -1, BLOCK)


def pad_outputs(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [P * 16, ...], the new rows zero."""
    pad = -t.shape[0] % PANEL
    return torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) if pad else t


def dense_view(w: torch.Tensor) -> torch.Tensor:
    """A dense weight [out, in] -> its panels [P, in, 16] as a view (padded rows zero): the dense formats'
    to_panels before the copy that makes it contiguous, which a chunked load leaves to its copy into the whole
    tensor's panels (one pass where the conversion, the transposition and that copy were three)."""
    w = pad_outputs(w)
    return w.view(w.shape[0] // PANEL, PANEL, w.shape[1]).transpose(1, 2)


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


# ---- a tensor packed a chunk of rows at a time ----------------------------------------------------------

def runs(raw, out: int, n_in: int, block: int, size: int):
    """A tensor's rows in runs of whole panels (the tensor's last may be partial), in order. raw: a GGUF tensor's
    bytes uint8 [out, row bytes] (`size`-byte blocks of `block` inputs; a dense tensor's values are blocks of 1 of
    size 1), or its rows in order as chunks of any sizes, read into a reused buffer (each run is used before the
    next chunk is asked for), so a tensor never needs its bytes twice; a chunk's rows past its last whole panel are
    carried into the next."""
    nb = -(-n_in // block)
    row, carry = 0, None
    for chunk in [raw] if isinstance(raw, torch.Tensor) else raw:
        if chunk.dim() != 2 or chunk.shape[1] != nb * size or row + chunk.shape[0] > out:
            raise ValueError(f"a [{out}, {n_in}] tensor of {size}-byte blocks of {block} is {out} rows of "
                             f"{nb * size} bytes, got {list(chunk.shape)} after {row} rows")
        chunk = chunk if carry is None else torch.cat((carry, chunk))
        whole = chunk.shape[0] // PANEL * PANEL
        carry = chunk[whole:].clone() if whole < chunk.shape[0] else None
        if whole:
            yield chunk[:whole]
        row += whole
    if carry is not None:
        yield carry
        row += len(carry)
    if row != out:
        raise ValueError(f"a [{out}, {n_in}] tensor of {size}-byte blocks of {block} is {out} rows, got {row}")


def fill(row_runs, out: int, pack) -> tuple[torch.Tensor, ...]:
    """A tensor's panels in a layout whose every tensor leads with the panel index, from its rows in runs of whole
    panels (the last may be partial) in order: pack(run) gives the layout's tensors for those rows, copied into the
    whole tensor's (made at the first run). Rows are independent in every format (a block is 32 or 256 inputs of
    one row), so the panels equal pack(all the rows)."""
    into: list[torch.Tensor] = []
    p0 = 0
    for run in row_runs:
        parts = pack(run)
        if not into:
            into.extend(torch.empty(-(-out // PANEL), *t.shape[1:], dtype=t.dtype) for t in parts)
        for whole, part in zip(into, parts, strict=True):
            whole[p0:p0 + len(part)].copy_(part)
        p0 += len(parts[0])
    return tuple(into)


def block_runs(chunks):
    """Blocks of a tensor's rows in order -> the same rows in runs of whole panels (the last may be partial), as
    runs cuts a file's bytes: a part of a merged projection whose rows end inside a panel has its last rows
    carried into the next part's (copied: a chunk's Blocks may be views of a buffer its source reuses)."""
    carry = None
    for b in chunks:
        b = b if carry is None else Blocks.cat([carry, b])
        whole = b.out_features // PANEL * PANEL
        carry = b.rows(whole, b.out_features, copy=True) if whole < b.out_features else None
        if whole:
            yield b.rows(0, whole)
    if carry is not None:
        yield carry


def pack_runs(chunks, out: int, n_in: int, block: int, size: int, pack) -> tuple[torch.Tensor, ...]:
    """A tensor's panels packed a run of whole panels at a time as its chunks are read (runs, fill)."""
    return fill(runs(chunks, out, n_in, block, size), out, pack)


def blocks_pack_gguf(size: int, from_gguf, pack):
    """pack_gguf for a format whose panels are not its file's bytes (Q8_0's and Q4_1's: offset codes, nibbles
    regrouped, scales apart): each run of whole panels is decoded to Blocks and packed (`pack`, the layout's), so
    the tensor's Blocks never exist whole (a Q8_0 embedding's int16 intermediates were 4x its bytes at load)."""
    def pack_gguf(raw, out: int, n_in: int) -> tuple[torch.Tensor, ...]:
        return pack_runs(raw, out, n_in, BLOCK, size, lambda rows: pack(from_gguf(rows, len(rows), n_in)))
    return pack_gguf


# ---- a GGUF block type's bytes, interleaved by 16 rows --------------------------------------------------
# A format whose panels are its file's bytes: each block's fields (ggml-common.h's struct, in order) as
# (bytes, unit): a field of `bytes` per row is cut into units and a panel stores unit u of its 16 rows side by
# side, [units][16 rows][unit], so unit 4 puts 4 bytes of 16 outputs in one 64-byte line (a VNNI operand) and
# unit 2 an fp16 scale of 16 outputs in one vector. Packing at load is a reorder of the file's bytes.


def native():
    """The CPU kernel library (csrc/cpu/ops_pack.cpp packs panels), or None where it is not loaded. The "cpu"
    layout is chosen only once engine.ops has loaded it, so asking builds nothing. Its packers move the same bytes
    as the torch code here (which stays their twin, and the path without the library) a block at a time in cache,
    where torch's strided copies of 1-4 byte elements made packing most of a warm load."""
    from engine.ops import ext  # here: engine.ops imports engine.weights

    return ext.load("cpu").module


def interleave(raw: torch.Tensor, out: int, fields: tuple[tuple[int, int], ...],
               into: torch.Tensor | None = None) -> torch.Tensor:
    """GGUF bytes uint8 [out, nb * B] (B = the block's bytes) -> panels [P, nb, 16 * B], padded rows zero; written
    into `into` where given (a slice of a larger tensor's panels): natively, else one strided copy per field."""
    size = sum(n for n, _ in fields)
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[0] != out or raw.shape[1] % size:
        raise ValueError(f"{list(raw.shape)} {raw.dtype} is not {out} rows of whole {size}-byte blocks (uint8)")
    P, nb = -(-out // PANEL), raw.shape[1] // size
    into = torch.empty(P, nb, PANEL * size, dtype=torch.uint8) if into is None else into
    if P == 0 or nb == 0:  # no rows or no inputs: nothing to move (an empty slice keeps its offset)
        return into
    if (lib := native()) is not None and into.is_contiguous():
        lib.interleave_panels(into, raw.contiguous(), list(fields))
        return into
    x = pad_outputs(raw).view(P, PANEL, nb, size)
    at = 0
    for n, unit in fields:
        # a unit moves as one element of the widest integer it is made of (4x fewer for 4-byte units): a field
        # whose offsets are not aligned to it (Q6_K's 210-byte blocks) is first gathered, a run of bytes a row
        w = next(w for w in (4, 2, 1) if unit % w == 0)
        part = x[..., at:at + n]
        if (at % w, size % w, x.storage_offset() % w) != (0, 0, 0):
            part = part.contiguous()
        tail = (unit // w,) if unit > w else ()  # a unit of one element has no dim: a trailing 1 slows copy_ 4x
        part = part.view(WIDE[w]).reshape(P, PANEL, nb, n // unit, *tail)
        part = part.permute(0, 2, 3, 1, *range(4, part.dim()))
        into[..., PANEL * at:PANEL * (at + n)].view(WIDE[w]).view(P, nb, n // unit, PANEL, *tail).copy_(part)
        at += n
    return into


def deinterleave(w: torch.Tensor, fields: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Panels [..., nb, 16 * B] -> the GGUF bytes of their rows [..., 16, nb, B] (the inverse of interleave)."""
    lead, nb = w.shape[:-2], w.shape[-2]
    parts, at = [], 0
    for n, unit in fields:
        part = w[..., at:at + PANEL * n].reshape(*lead, nb, n // unit, PANEL, unit)
        parts.append(part.movedim(-2, -4).reshape(*lead, PANEL, nb, n))
        at += PANEL * n
    return torch.cat(parts, -1)


def panel_bytes(w: torch.Tensor, out: int, fields: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """Panels [P, nb, 16 * B] -> the GGUF bytes uint8 [out, nb * B]."""
    x = deinterleave(w, fields)  # [P, 16, nb, B]
    return x.reshape(-1, x.shape[2] * x.shape[3])[:out].contiguous()


def gguf_layout(block: int, fields: tuple[tuple[int, int], ...], from_gguf, to_gguf, dequantize, bits=None,
                native_rows=None):
    """The "cpu" Layout of a format whose panels are its GGUF bytes interleaved (above): every direction goes
    through the file's codec, so packing, unpacking and a row's lookup are exact by construction. bits: a
    format's (place, unplace), which move bits between the bytes of each panel once interleaved (place, in place)
    and move them back before the bytes are read as the file's (unplace, into a new tensor): a bijection the
    format's kernel reads more cheaply than the file's arrangement (k_placed.py place_q6_k). native_rows(panels,
    ids, in_features): the same rows as the lookup below, from the CPU kernel library, or None without it."""
    from engine.weights.format import Layout

    size = sum(n for n, _ in fields)
    place, unplace = bits or (lambda w: w, lambda w: w)

    def pack_gguf(raw, out: int, n_in: int) -> tuple[torch.Tensor, ...]:
        into = torch.empty(-(-out // PANEL), -(-n_in // block), PANEL * size, dtype=torch.uint8)
        p0 = 0
        for rows in runs(raw, out, n_in, block, size):
            n = -(-len(rows) // PANEL)
            place(interleave(rows, len(rows), fields, into[p0:p0 + n]))
            p0 += n
        return (into,)

    def pack(b) -> tuple[torch.Tensor, ...]:
        return (place(interleave(to_gguf(b), b.out_features, fields)),)

    def unpack(fmt: str, out: int, n_in: int, tensors):
        lead = (-(-out // PANEL), -(-n_in // block), PANEL * size)
        if len(tensors) != 1 or tuple(tensors[0].shape) != lead:
            raise ValueError(f"{fmt} panels for [{out}, {n_in}] are one tensor {list(lead)}, got "
                             f"{[list(t.shape) for t in tensors]}")
        b = from_gguf(panel_bytes(unplace(tensors[0]), out, fields), out, n_in)
        b.fmt = fmt
        return b

    def rows(p, ids: torch.Tensor) -> torch.Tensor:  # dense, as the kernels take an embedding's rows
        if native_rows is not None and (got := native_rows(p.tensors[0], ids, p.in_features)) is not None:
            return got
        held = unplace(p.tensors[0][ids // PANEL])  # only the panels the rows are in
        x = deinterleave(held, fields)[torch.arange(len(ids)), ids % PANEL].reshape(len(ids), -1)
        return dequantize(from_gguf(x, len(ids), p.in_features)).contiguous()

    return Layout(pack, unpack, rows, pack_gguf)
