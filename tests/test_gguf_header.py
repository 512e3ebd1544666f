"""engine/checkpoint/gguf_header.py reads a GGUF file's metadata and tensor index as gguf's own GGUFReader does
(the reference: every value of every type, every tensor's type, shape, offset and size), and a cut or corrupt
header fails with a ValueError naming the byte, never another exception."""
import random

import gguf
import numpy as np
import pytest

from engine.checkpoint import gguf_header
from gguf_files import family_files

V = gguf.GGUFValueType
SCALARS = {V.UINT8: 200, V.INT8: -100, V.UINT16: 60000, V.INT16: -30000, V.UINT32: 4_000_000_000,
           V.INT32: -2_000_000_000, V.FLOAT32: 0.1, V.BOOL: True, V.UINT64: 2**63 + 5, V.INT64: -(2**62),
           V.FLOAT64: 1e-300}


def reference(path):
    """GGUFReader's view: {key: contents}, [(name, type, shape, offset, bytes)]."""
    r = gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, t.tensor_type.name, tuple(int(n) for n in t.shape), int(t.data_offset), int(t.n_bytes))
               for t in r.tensors]
    return fields, tensors, r.data_offset


def ours(path):
    h = gguf_header.read(path)
    return h.fields, [(t.name, t.type, t.shape, t.offset, t.n_bytes) for t in h.tensors], h.data_offset


def write(path, kv=(), tensors=(), alignment=None, **writer):
    w = gguf.GGUFWriter(str(path), "llama", **writer)
    if alignment:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, array, raw in tensors:
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def every_value(tmp_path_factory):
    """Every scalar type, strings (empty, non-ASCII), arrays of each type, and tensors of several
    types and shapes at an alignment of 64."""
    kv = [(f"s.{t.name}", v, t, None) for t, v in SCALARS.items()]
    kv += [(f"a.{t.name}", [v, v, v] if t != V.BOOL else [True, False, True], t, V.ARRAY) for t, v in SCALARS.items()]
    kv = [(k, v, V.ARRAY if sub else t, t if sub else None) for k, v, t, sub in kv]
    kv += [("str", "héllo ▁ 世界", V.STRING, None), ("empty", "", V.STRING, None),
           ("strs", ["", "a", "▁▁", "<0x0A>", "日本"], V.ARRAY, V.STRING)]
    rng = np.random.default_rng(0)
    blocks = gguf.quants.quantize(rng.standard_normal((8, 256)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    tensors = [("a.weight", rng.standard_normal((3, 5)).astype(np.float32), None),
               ("b.weight", rng.standard_normal(7).astype(np.float16), None),
               ("c.weight", blocks, gguf.GGMLQuantizationType.Q8_0)]
    return write(tmp_path_factory.mktemp("values") / "v.gguf", kv, tensors, alignment=64)


def test_every_value_type_reads_as_gguf_reads_it(every_value):
    want, got = reference(every_value), ours(every_value)
    assert got == want
    assert got[2] % 64 == 0 and got[0]["s.FLOAT32"] == np.float32(0.1) and got[0]["s.UINT64"] == 2**63 + 5
    assert got[0]["s.BOOL"] is True and [type(v) for v in got[0]["a.BOOL"]] == [bool] * 3  # 1 == True


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text"])
def test_a_model_files_header_reads_as_gguf_reads_it(family, tmp_path):
    path = family_files(family, tmp_path)[0]
    assert ours(path) == reference(path)


def test_a_cut_header_fails_with_a_value_error_at_every_byte(every_value, tmp_path):
    data = every_value.read_bytes()
    end = gguf_header.read(every_value).data_offset
    f = tmp_path / "cut.gguf"
    for cut in range(0, end + 1, 3):
        f.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            gguf_header.read(f)


def test_a_flipped_byte_fails_with_a_value_error_or_reads(every_value, tmp_path):
    """Corrupt counts, lengths, types and offsets anywhere in the header give a ValueError (or, where the byte
    was a value's own, a header): never an IndexError, struct.error, MemoryError or a hang."""
    data = every_value.read_bytes()
    end = gguf_header.read(every_value).data_offset
    rng = random.Random(0)
    f = tmp_path / "flip.gguf"
    failed = 0
    for _ in range(400):
        bad = bytearray(data)
        at = rng.randrange(end)
        bad[at] ^= 1 << rng.randrange(8) if rng.random() < 0.5 else 0xFF
        f.write_bytes(bytes(bad))
        try:
            gguf_header.read(f)
        except ValueError:
            failed += 1
    assert failed > 40  # the flips that hit a length, count or type are refused


def test_what_we_do_not_read_is_named(every_value, tmp_path):
    data = every_value.read_bytes()
    cases = {"magic": (b"GGXX" + data[4:], "not the GGUF magic"),
             "version": (data[:4] + (9).to_bytes(4, "little") + data[8:], "GGUF version 9; decodescope reads")}
    for name, (raw, words) in cases.items():
        f = tmp_path / f"{name}.gguf"
        f.write_bytes(raw)
        with pytest.raises(ValueError, match=words):
            gguf_header.read(f)
    big = write(tmp_path / "big.gguf", [("x", 1, V.UINT32, None)], endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(ValueError, match="big-endian GGUF file"):
        gguf_header.read(big)
    odd = write(tmp_path / "align.gguf", [("general.alignment", 48, V.UINT32, None)])
    with pytest.raises(ValueError, match="general.alignment is 48, not a power of two"):
        gguf_header.read(odd)


def test_a_count_past_the_file_or_arrays_nested_too_deep_are_refused(tmp_path):
    def header(kv: bytes, n_kv=1) -> bytes:
        return gguf.GGUF_MAGIC.to_bytes(4, "little") + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") \
            + n_kv.to_bytes(8, "little") + kv

    def key(name: bytes) -> bytes:
        return len(name).to_bytes(8, "little") + name

    f = tmp_path / "h.gguf"
    huge = key(b"a") + int(V.ARRAY).to_bytes(4, "little") + int(V.UINT32).to_bytes(4, "little") \
        + (2**60).to_bytes(8, "little")
    f.write_bytes(header(huge))
    with pytest.raises(ValueError, match="claims 1152921504606846976 items, more than the file holds"):
        gguf_header.read(f)
    nest = b"".join(int(V.ARRAY).to_bytes(4, "little") + (1).to_bytes(8, "little") for _ in range(2000))
    f.write_bytes(header(key(b"n") + int(V.ARRAY).to_bytes(4, "little") + nest))
    with pytest.raises(ValueError, match="arrays nest more than 4 deep"):
        gguf_header.read(f)
    f.write_bytes(header(b"", n_kv=2**40))
    with pytest.raises(ValueError, match="claims 1099511627776 items"):
        gguf_header.read(f)


def test_a_tensor_past_the_end_or_of_part_blocks_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    blocks = gguf.quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    path = write(tmp_path / "t.gguf", tensors=[("w", blocks, gguf.GGMLQuantizationType.Q8_0)])
    data, info = path.read_bytes(), gguf_header.read(path)
    end = info.tensors[0].offset + info.tensors[0].n_bytes
    f = tmp_path / "short.gguf"
    f.write_bytes(data[:end - 1])
    with pytest.raises(ValueError, match=rf"tensor 'w' ends at byte {end}, past the end \({end - 1}\)"):
        gguf_header.read(f)
    f.write_bytes(data[:end])
    assert gguf_header.read(f) == info
    at = data.index(b"w", 24) + 1 + 4  # name, then n_dims: the first dim (64 elements of a row)
    assert int.from_bytes(data[at:at + 8], "little") == 64 and info.tensors[0].shape == (64, 2)
    f.write_bytes(data[:at] + (48).to_bytes(8, "little") + data[at + 8:])
    with pytest.raises(ValueError, match=r"tensor 'w' of shape \[48, 2\] is not rows of whole Q8_0 blocks of 32"):
        gguf_header.read(f)
