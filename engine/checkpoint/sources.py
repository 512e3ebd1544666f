"""Where a model's tensors are read from, one tensor at a time: an HF folder's safetensors, or a GGUF file in place.

A source answers, for every HF tensor name the family's recipe asks for: its shape, the GGUF type it is stored in
(None for a safetensors tensor), its bytes as the file stores them (`raw`: uint8 [out, row bytes]) and its values
(`dense`), and both a chunk of rows at a time (`raw_chunks`, `dense_chunks`: what the CPU path packs from). Nothing
is read before a tensor is asked for, and each is read once: the loader packs it and lets it go, so no fp32 copy of
a quantized model exists anywhere.

A GGUF file is read through the index its cached folder keeps (INDEX_FILE, written once by gguf_convert.py: each
tensor's GGUF name, type, offset and shape), so a warm load parses no header. Its bytes are read with a plain
read into a buffer of their own size, not touched through a memory map: the page cache keeps the file warm for
the next load, and the process holds only what it packed. llama.cpp's conversions are undone as rows are read:
the q/k row permutation of llama-arch files (whole rows of blocks move), the 1 + w of Gemma's norms.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from engine.checkpoint.errors import ModelLoadError
from engine.weights.panels import PANEL

INDEX_FILE = "gguf.json"  # {"file", "size", "tensors": {hf name: [gguf name, GGUF type, offset, bytes, shape]}}
CHUNK_BYTES = 4 << 20  # a tensor read a chunk at a time (raw_chunks): the one buffer a load holds besides its weights
# dense values (dense_chunks) are quantized a chunk at a time, torch ops whose fixed cost 4 MB chunks paid ~250 times
# for a 0.5B: loading its bf16 folder in q4 took 6.3-6.6 s with them, 4.7-4.9 s with 16 MB (peak RSS +35 MB)
DENSE_CHUNK_BYTES = 16 << 20
DENSE_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def chunk_rows(out: int, row_bytes: int, chunk_bytes: int, step: int = PANEL) -> int:
    """Rows a chunk of a tensor's `out` rows holds: about chunk_bytes of them, a whole number of steps (panels of
    the CPU kernels, and whole heads where q/k rows are reordered), at least one step, at most the tensor."""
    return min(out, max(step, chunk_bytes // row_bytes // step * step))


class SafetensorsSource:
    """An HF folder's *.safetensors (sharded or not), opened once; `found` is hf.index_tensors'."""

    def __init__(self, found: dict[str, tuple[Path, tuple[int, ...]]]):
        from safetensors import safe_open  # here: a GGUF load never imports it

        self.found = found
        self.handles = {f: safe_open(f, framework="pt") for f, _ in set(found.values())}
        self.shapes = {name: shape for name, (_, shape) in found.items()}
        self.path = next(iter(self.handles), None)
        self.spans: dict[Path, tuple[int, dict]] = {}  # file -> (where its data starts, its header), as read

    def gguf_type(self, name: str) -> str | None:
        return None

    def dense_type(self, name: str) -> str:
        """The tensor's dtype as safetensors names it (F32, F16, BF16, ...), from the file's header."""
        return self.handles[self.found[name][0]].get_slice(name).get_dtype()

    def gguf_name(self, name: str) -> str:
        return name

    def dense(self, name: str) -> torch.Tensor:
        return self.handles[self.found[name][0]].get_tensor(name)

    def dense_chunks(self, name: str, chunk_bytes: int = DENSE_CHUNK_BYTES):
        """dense(name) of a matrix [out, in], a chunk of whole panels of rows at a time, read from the file into
        one reused buffer (valid until the next is asked for): the tensor is never in memory whole, nor mapped
        (safe_open's mmap would leave every page read in RSS until the load ends). The byte span comes from the
        file's header (8 bytes of length, then JSON: each tensor's dtype, shape and data_offsets after it)."""
        path = self.found[name][0]
        if path not in self.spans:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                self.spans[path] = (8 + n, json.loads(f.read(n)))
        start, header = self.spans[path]
        entry = header[name]
        dtype = DENSE_TYPES.get(entry["dtype"])
        if dtype is None or len(entry["shape"]) != 2:  # not a dense matrix: whole, as safetensors reads it
            yield self.dense(name)
            return
        (out, n_in), item = entry["shape"], dtype.itemsize
        rows = chunk_rows(out, n_in * item, chunk_bytes)
        buf = torch.empty(rows * n_in * item, dtype=torch.uint8)
        with open(path, "rb", buffering=0) as f:
            for r0 in range(0, out, rows):
                r = min(rows, out - r0)
                f.seek(start + entry["data_offsets"][0] + r0 * n_in * item)
                view = buf[:r * n_in * item]
                if f.readinto(memoryview(view.numpy())) != len(view):
                    raise ModelLoadError(f"{path} ends inside tensor {name!r}; the file is truncated: download it "
                                         "again")
                yield view.view(dtype).view(r, n_in)

    def close(self) -> None:
        self.handles.clear()


def unpermuted(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order (each head's two rotary halves interleaved into pairs) on rows of any
    content (values, or a row's blocks as bytes): a view [n_head, 2, half, ...] of x in HF's order."""
    half = x.shape[0] // n_head // 2
    return x.reshape(n_head, half, 2, *x.shape[1:]).transpose(1, 2)


def unpermute_rows(x: torch.Tensor, n_head: int) -> torch.Tensor:
    return unpermuted(x, n_head).reshape(x.shape).contiguous()


class GGUFSource:
    """A GGUF file's tensors by HF name, read in place through its index (see the module's docstring)."""

    def __init__(self, folder: Path, cfg):
        index = json.loads((folder / INDEX_FILE).read_text())
        self.path = Path(index["file"])
        if not self.path.is_file() or self.path.stat().st_size != index["size"]:

            raise ModelLoadError(f"{folder} reads the GGUF file {self.path}, which is gone or changed since; load "
                                 "the GGUF file itself again (its folder in the model cache is rebuilt)")
        self.index = {name: tuple(v) for name, v in index["tensors"].items()}
        self.shapes = {name: tuple(v[4]) for name, v in self.index.items()}
        family = cfg.family
        self.heads = {}
        if family.gguf_permute_qk:
            for name, (gname, *_rest) in self.index.items():
                kind = gname.split(".")[2] if gname.startswith("blk.") else None
                if kind in ("attn_q", "attn_k"):
                    self.heads[name] = cfg.n_heads if kind == "attn_q" else cfg.n_kv_heads
        self.norm_offset = family.norm_offset
        self.file = open(self.path, "rb", buffering=0)  # noqa: SIM115  (closed by close(), after the load)

    def gguf_type(self, name: str) -> str:
        return self.index[name][1]

    def dense_type(self, name: str) -> str:
        return self.gguf_type(name)

    def gguf_name(self, name: str) -> str:
        return self.index[name][0]

    def nbytes(self, name: str) -> int:
        return self.index[name][3]

    def _read(self, name: str, start: int = 0, buf: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor's bytes from `start` on, into `buf` (as many as it holds) or a buffer of their own."""
        _, gtype, offset, n, _ = self.index[name]
        buf = torch.empty(n - start, dtype=torch.uint8) if buf is None else buf
        self.file.seek(offset + start)
        got = self.file.readinto(memoryview(buf.numpy()))
        if got != len(buf):

            raise ModelLoadError(f"{self.path} ends inside tensor {self.gguf_name(name)!r} ({start + got} of {n} "
                                 "bytes); the file is truncated: download it again")
        return buf

    def raw_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES):
        """raw(name) as chunks of whole rows (whole heads where q/k rows are reordered) of about chunk_bytes, each
        read into the same buffer: valid until the next is asked for. A packer that takes them holds one chunk
        besides what it packed, never the tensor's bytes twice. Chunks are whole panels of the CPU kernels (16
        rows, panels.PANEL) too, so none is carried over into the next."""
        _, _, _, n, shape = self.index[name]
        out, row_bytes = shape[0], n // shape[0]
        heads = self.heads.get(name)
        step = math.lcm(out // heads if heads else 1, PANEL)
        rows = chunk_rows(out, row_bytes, chunk_bytes, step)
        buf = torch.empty(rows * row_bytes, dtype=torch.uint8)
        order = torch.empty_like(buf) if heads else None
        for r0 in range(0, out, rows):
            r = min(rows, out - r0)
            x = self._read(name, r0 * row_bytes, buf[:r * row_bytes]).view(r, row_bytes)
            if heads:
                hf = unpermuted(x, r // step)
                x = order[:r * row_bytes].view(hf.shape).copy_(hf).view(r, row_bytes)
            yield x

    def raw(self, name: str) -> torch.Tensor:
        """The tensor's blocks as the file stores them, rows in HF order: uint8 [out, row bytes]."""
        out = self.shapes[name][0]
        x = self._read(name).view(out, -1)
        return unpermute_rows(x, self.heads[name]) if name in self.heads else x

    def dense_chunks(self, name: str, chunk_bytes: int = DENSE_CHUNK_BYTES):
        """dense(name) of a matrix [out, in] (F32, F16, BF16), a chunk of rows at a time: raw_chunks' bytes as
        values (its buffer, valid until the next is asked for)."""
        dtype = DENSE_TYPES[self.gguf_type(name)]
        for x in self.raw_chunks(name, chunk_bytes):
            yield x.view(dtype)

    def dense(self, name: str) -> torch.Tensor:
        """The tensor's values as HF holds them ([out, in] or [n]), for the dense GGUF types."""
        gtype = self.gguf_type(name)
        x = self._read(name).view(DENSE_TYPES[gtype]).view(self.shapes[name])
        if name in self.heads:
            x = unpermute_rows(x, self.heads[name])
        if name.endswith("norm.weight") and self.norm_offset:
            x = x.float() - float(np.float32(self.norm_offset))  # llama.cpp stores Gemma's (1 + w)
        return x

    def close(self) -> None:
        self.file.close()


def source(folder: Path, cfg, found) -> SafetensorsSource | GGUFSource:
    """The folder's tensors: a GGUF file's in place where the folder indexes one, else its safetensors."""
    return GGUFSource(folder, cfg) if (folder / INDEX_FILE).is_file() else SafetensorsSource(found)
