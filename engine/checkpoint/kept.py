"""Stand-in blocks kept in the model cache: what a GGUF file's own mix forces the loader to re-quantize (a Q4_K_M
file's Q4_K q and k merged with a Q6_K v run as q6_k) is rounded once, on the first start, and read back on the next.

Only the file's own choice is kept (a load that asks for a format re-quantizes as asked, every start), and only
while the kept blocks stay under KEEP_SHARE of the file: the model cache stays small (for a 1.5B Q4_K_M file, 28
tensors, ~40 MB). The blocks are the ones the first start made, bit for bit (safetensors, one entry per tensor and
field); the file lives in the GGUF file's own cache folder, whose name already changes when the file does.

    kept = Kept(folder, budget)             # reads what an earlier start wrote
    blocks = kept.get(name, fmt, make)      # the kept Blocks, or make() once and keep them
    kept.save()                             # after the load: written beside, renamed into place
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine import weights as wts

FILE = "requantized.safetensors"
KEEP_SHARE = 0.1  # of the GGUF file's size: past it, blocks are rounded again at each start instead
FIELDS = ("q", "d", "m", "sc", "mn")
DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


class Stored:
    """A safetensors file read a tensor at a time with plain reads, not through a memory map (safe_open's): a
    mapped file's pages count in the process's RSS until the map goes, after the load, when the peak is past."""

    def __init__(self, path: Path):
        self.path = path
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            self.header = {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
        self.start, size = 8 + n, path.stat().st_size
        if any(self.start + v["data_offsets"][1] > size or v["dtype"] not in DTYPES for v in self.header.values()):
            raise ValueError(f"{path} is truncated or holds a dtype not kept here")

    def keys(self):
        return self.header.keys()

    def get_tensor(self, key: str) -> torch.Tensor:
        entry = self.header[key]
        t = torch.empty(entry["shape"], dtype=DTYPES[entry["dtype"]])
        begin, end = entry["data_offsets"]
        if t.nbytes != end - begin:
            raise ValueError(f"{self.path}: {key} is {end - begin} bytes for {entry['shape']} {entry['dtype']}")
        with self.path.open("rb", buffering=0) as f:
            f.seek(self.start + begin)
            f.readinto(memoryview(t.view(-1).view(torch.uint8).numpy()))
        return t


class Kept:
    def __init__(self, folder: Path | None, budget: int):
        self.path = None if folder is None else Path(folder) / FILE
        self.budget = budget
        self.stored, self.keys = None, set()  # what an earlier start wrote, read a tensor at a time when asked
        self.added: dict[str, torch.Tensor] = {}
        if self.path is not None and self.path.is_file():
            try:
                self.stored = Stored(self.path)
                self.keys = set(self.stored.keys())
            except Exception:  # a damaged file is rounded again and rewritten, never trusted
                self.stored, self.keys = None, set()
        self.size = self.path.stat().st_size if self.stored is not None else 0

    def tensor(self, key: str) -> torch.Tensor | None:
        if key in self.added:
            return self.added[key]
        return self.stored.get_tensor(key) if key in self.keys else None

    def get(self, name: str, fmt: str, make) -> wts.Blocks:
        """Tensor `name`'s Blocks in `fmt` as kept, else make() (kept if the budget allows)."""
        key = f"{name}:{fmt}"
        if f"{key}:q" in self.keys or f"{key}:q" in self.added:
            shape = self.tensor(f"{key}:shape").tolist()
            return wts.Blocks(fmt, shape[0], shape[1], **{f: self.tensor(f"{key}:{f}") for f in FIELDS})
        blocks = make()
        size = sum(t.numel() * t.element_size() for t in blocks.tensors)
        if self.path is not None and self.size + size <= self.budget:
            for f in FIELDS:
                if getattr(blocks, f) is not None:
                    self.added[f"{key}:{f}"] = getattr(blocks, f).contiguous()
            self.added[f"{key}:shape"] = torch.tensor([blocks.out_features, blocks.in_features])
            self.size += size
        return blocks

    def save(self) -> None:
        """Write what this start rounded (a folder that cannot be written to is left as it is: the next start
        rounds again)."""
        if not self.added or self.path is None:
            return
        everything = {k: self.stored.get_tensor(k) for k in self.keys} | self.added
        part = self.path.with_name(f"{FILE}.{os.getpid()}.part")
        try:
            save_file(everything, part)
            os.replace(part, self.path)
        except OSError:
            part.unlink(missing_ok=True)
        self.added = {}
