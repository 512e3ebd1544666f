"""A GGUF file's header (metadata, then the tensors' index), read in one pass over its bytes.

gguf's GGUFReader makes a numpy view of the file for every value it meets, two for each string: Gemma 3's
262,144-token vocabulary (tokens, scores, types) becomes ~800,000 views, 27 s and 700 MB of RSS on a 2-core box
for a 253 MB file, on every first load. The header is a few MB of length-prefixed values (ggml's docs/gguf.md):
this reads it with struct, strings as str and numeric arrays with one numpy read each. The gguf package keeps
the tables (value and tensor types, block sizes) and stays the tests' reference reader.

    header = read(Path("model.gguf"))
    header.fields["tokenizer.ggml.tokens"]      # a list of str; numeric arrays as lists of Python numbers
    header.tensors[0]                           # TensorInfo(name, type, shape fastest-first, offset, n_bytes)

A truncated or corrupt header, a big-endian file, or a version we do not read raises ValueError naming the byte
and the value; a tensor whose bytes run past the end of the file too.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

VERSIONS = (2, 3)  # 1 had 32-bit counts and lengths; llama.cpp has written 3 since 2023
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays: no writer nests them deeper; a corrupt file could, past Python's stack
STRING, ARRAY = GGUFValueType.STRING, GGUFValueType.ARRAY
SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
           GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f",
           GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q",
           GGUFValueType.FLOAT64: "d"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: str                 # ggml's type name: "Q4_K", "F32", ...
    shape: tuple[int, ...]    # GGUF order, fastest dim first ([in, out] for a matrix)
    offset: int               # of its first byte in the file
    n_bytes: int


@dataclass(frozen=True)
class Header:
    version: int
    fields: dict[str, object]
    tensors: list[TensorInfo]
    data_offset: int          # where the tensors' bytes start (the index, padded to general.alignment)


class _Cursor:
    """Little-endian reads from the file's mapped bytes, each checked against their end and copied out (so
    nothing holds the map when it closes)."""

    def __init__(self, buf: mmap.mmap):
        self.buf, self.at = buf, 0

    def take(self, n: int) -> int:
        start = self.at
        if n < 0 or start + n > len(self.buf):
            raise ValueError(f"a value at byte {start} needs {n} bytes, past the end of the file ({len(self.buf)})")
        self.at += n
        return start

    def scalar(self, code: str):
        return struct.unpack_from("<" + code, self.buf, self.take(struct.calcsize(code)))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        at = self.take(n)
        try:
            return self.buf[at:at + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"the string at byte {at} is not UTF-8 ({e.reason})") from None

    def count(self, n: int, least: int) -> int:
        """n items of at least `least` bytes each must fit in what is left: a corrupt count fails here."""
        if n * least > len(self.buf) - self.at:
            raise ValueError(f"an array at byte {self.at} claims {n} items, more than the file holds")
        return n

    def value(self, kind: int, depth: int = 0):
        kind = GGUFValueType(kind)
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = GGUFValueType(self.scalar("I")), self.scalar("Q")
            if item in SCALARS:
                dtype = np.dtype("<" + SCALARS[item])
                at = self.take(self.count(n, dtype.itemsize) * dtype.itemsize)
                return np.frombuffer(self.buf[at:self.at], dtype).tolist()
            if depth == MAX_NESTING:
                raise ValueError(f"arrays nest more than {MAX_NESTING} deep at byte {self.at}")
            return [self.value(item, depth + 1) for _ in range(self.count(n, 8 if item == STRING else 12))]
        return self.scalar(SCALARS[kind])


def read(path: Path) -> Header:
    """The file's header; its tensors' bytes are not read."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return _parse(_Cursor(mm), len(mm))


def _parse(cur: _Cursor, size: int) -> Header:
    if cur.scalar("I") != GGUF_MAGIC:
        raise ValueError("its first 4 bytes are not the GGUF magic")
    version = cur.scalar("I")
    if version & 0xFFFF == 0:
        raise ValueError("it is a big-endian GGUF file; decodescope reads little-endian ones (what llama.cpp writes "
                         "on x86 and ARM)")
    if version not in VERSIONS:
        raise ValueError(f"it is GGUF version {version}; decodescope reads versions {VERSIONS}")
    n_tensors, n_fields = cur.scalar("Q"), cur.scalar("Q")
    fields = {}
    for _ in range(cur.count(n_fields, 12)):
        key = cur.string()
        if key in fields:
            raise ValueError(f"metadata key {key!r} appears twice")
        fields[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(cur.count(n_tensors, 24)):
        name, n_dims = cur.string(), cur.scalar("I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dims (ggml's tensors have 1 to {MAX_DIMS})")
        shape = tuple(cur.scalar("Q") for _ in range(n_dims))
        infos.append((name, shape, GGMLQuantizationType(cur.scalar("I")), cur.scalar("Q")))
    align = fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment is {align!r}, not a power of two")
    data_offset = -(-cur.at // align) * align
    tensors, names = [], set()
    for name, shape, gtype, rel in infos:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        block, block_bytes = GGML_QUANT_SIZES[gtype]
        if shape[0] % block:  # ggml's rule: a row is whole blocks
            raise ValueError(f"tensor {name!r} of shape {list(shape)} is not rows of whole {gtype.name} blocks of "
                             f"{block}")
        elements = int(np.prod(shape, dtype=object))
        t = TensorInfo(name, gtype.name, shape, data_offset + rel, elements // block * block_bytes)
        if t.offset + t.n_bytes > size:
            raise ValueError(f"tensor {name!r} ends at byte {t.offset + t.n_bytes}, past the end ({size})")
        tensors.append(t)
    return Header(version, fields, tensors, data_offset)
