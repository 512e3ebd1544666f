"""A GGUF file is run in place: its tensors are read from the file and packed at their own size (no fp32 copy of a
quantized tensor, the model cache a few small files), its untied embedding stays in its blocks, a tensor type we
do not read (an IQ-quant) is refused by name, and a model that would not fit is refused before a tensor is read,
with the bytes it needs and the bytes there are."""
import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine import Engine, ModelLoadError, load_model, weights
from engine.checkpoint import memory, sources
from gguf_files import MIX, family_files

# our merged projections: their HF parts, and each part's kind of GGUF tensor
PARTS = {"attn.wqkv": [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v")],
         "attn.wo": [("self_attn.o_proj", "attn_output")],
         "mlp.w_gate_up": [("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up")],
         "mlp.w_down": [("mlp.down_proj", "ffn_down")]}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Untied (its embedding Q8_0 and head Q5_K), q/k rows permuted as llama.cpp writes them."""
    root = tmp_path_factory.mktemp("llama")
    return (*family_files("llama", root), root / "cache")


def quiet(*args, **kw):
    return load_model(*args, progress=lambda s: None, **kw)


def block_bytes(path) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if t.tensor_type.name not in ("F32", "F16"))


def test_the_packed_model_is_the_files_size(llama):
    """Every projection in blocks (each part its own), the embedding in the file's bytes: no tensor in fp32 but the
    norms."""
    gguf_file, values, cache = llama
    model = quiet(gguf_file, cache_dir=cache)
    if model.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    assert all(weights.get(s.fmt).quantized for m in model.linears() for s in m.weight.segments)
    assert isinstance(model.embed, torch.nn.Module) and model.embed.raw.dtype == torch.uint8
    packed = sum(m.weight.nbytes for m in model.linears()) + model.embed.raw.numel()
    assert packed <= 1.3 * block_bytes(gguf_file)
    fp32 = sum(4 * m.in_features * m.out_features for m in model.linears())
    assert packed < 0.4 * fp32


def test_the_embedding_rows_are_the_files_values(llama):
    gguf_file, values, cache = llama
    model = quiet(gguf_file, cache_dir=cache)
    ids = torch.tensor([[0, 5, 257], [3, 3, 100]])
    want = load_file(values / "model.safetensors")["model.embed_tokens.weight"][ids.reshape(-1)]
    if isinstance(model.embed, torch.nn.Embedding):
        pytest.skip("the embedding is dense on this path")
    assert torch.equal(model.embed(ids).reshape(-1, want.shape[1]), want)


def test_in_place_fp32_is_bit_equal_to_the_files_values(llama):
    """The file read in place in fp32 and the HF folder of the values it stands for: the same logits, bit for bit."""
    gguf_file, values, cache = llama
    ids = list(range(3, 40))
    want = Engine(quiet(values, weights="fp32"), 64).logits(ids)
    got = Engine(quiet(gguf_file, weights="fp32", cache_dir=cache), 64).logits(ids)
    assert torch.equal(got, want)


def test_an_iq_quant_is_refused_by_name(llama, tmp_path):
    """IQ4_NL has Q4_0's block size (18 bytes a 32): a file declaring one of its tensors IQ4_NL is otherwise sound."""
    gguf_file, _, _ = llama
    reader = gguf.GGUFReader(gguf_file)
    w = gguf.GGUFWriter(str(tmp_path / "iq.gguf"), "llama")
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            kw = {"sub_type": field.types[-1]} if field.types[0] == gguf.GGUFValueType.ARRAY else {}
            w.add_key_value(name, field.contents(), field.types[0], **kw)
    for t in reader.tensors:
        kind = gguf.GGMLQuantizationType.IQ4_NL if t.tensor_type.name == "Q4_0" else t.tensor_type
        w.add_tensor(t.name, np.array(t.data), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"iq.gguf stores 2 tensors in types decodescope does not read \(IQ-quants "
                                             r"are not read\): blk.0.ffn_up.weight \(IQ4_NL\).*llama-quantize"):
        quiet(tmp_path / "iq.gguf", cache_dir=tmp_path / "cache")


def test_a_model_that_does_not_fit_is_refused_before_a_tensor_is_read(llama, monkeypatch):
    gguf_file, _, cache = llama
    quiet(gguf_file, cache_dir=cache)  # indexed; the next load reads no header

    def no_reads(self, name):
        raise AssertionError(f"{name} was read")

    monkeypatch.setattr(memory, "available_bytes", lambda: 123_456)
    monkeypatch.setattr(sources.GGUFSource, "_read", no_reads)
    with pytest.raises(ModelLoadError, match=r"llama.gguf needs about 0.00 GiB of memory to load \([\d,]+ bytes: .* "
                                             r"and this machine has 0.00 GiB available \(123,456 bytes\)"):
        quiet(gguf_file, cache_dir=cache)


def test_a_tensor_read_in_chunks_is_its_rows(llama):
    """raw_chunks reads a tensor into one reused buffer a few rows at a time (whole heads of the q/k rows it puts
    back in HF order): the chunks, copied as they come, are raw(name)'s rows, at any chunk size."""
    from engine.checkpoint import gguf_convert
    from engine.checkpoint.hf import check_folder

    gguf_file, _, cache = llama
    cfg, src = check_folder(gguf_convert.cached(gguf_file, cache, progress=lambda s: None))
    try:
        assert src.heads  # the q/k tensors' rows are reordered as they are read
        for name in src.index:
            if len(src.shapes[name]) != 2:
                continue
            whole = src.raw(name)
            for chunk_bytes in (1, whole.shape[1] * 3, 1 << 20):
                chunks = [c.clone() for c in src.raw_chunks(name, chunk_bytes)]
                assert torch.equal(torch.cat(chunks), whole), (name, chunk_bytes)
                step = src.shapes[name][0] // src.heads[name] if name in src.heads else 1
                assert all(len(c) % step == 0 for c in chunks)  # whole heads
                assert all(len(c) % 16 == 0 for c in chunks[:-1])  # whole panels: none carried into the next
    finally:
        src.close()


def test_q8_0_and_q4_1_tensors_are_decoded_a_chunk_at_a_time(llama, monkeypatch):
    """Q8_0 and Q4_1 tensors, whose panels are not the file's bytes, are decoded and packed a chunk of rows at a
    time as the file is read (panels.blocks_pack_gguf), never as one tensor's Blocks (a Q8_0 embedding's int16
    intermediates were 4x its bytes at load): read 1 KB at a time, no decode of the load sees more than 16 rows,
    and the model gives the logits of a load that reads each of these tensors whole."""
    from engine.weights import gguf_bytes

    gguf_file, _, cache = llama
    ids = list(range(3, 40))
    model = quiet(gguf_file, cache_dir=cache)
    if model.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    want = Engine(model, 64).logits(ids)
    decoded, blocks, raw_chunks = [], gguf_bytes.blocks, sources.GGUFSource.raw_chunks

    def seen(raw, out, size):
        decoded.append((size, out))
        return blocks(raw, out, size)

    monkeypatch.setattr(gguf_bytes, "blocks", seen)
    monkeypatch.setattr(sources.GGUFSource, "raw_chunks", lambda self, name, _=0: raw_chunks(self, name, 1024))
    model = quiet(gguf_file, cache_dir=cache)
    monkeypatch.undo()  # the embedding's lookups decode their rows from here on
    assert {size for size, _ in decoded} == {34, 20}  # Q8_0's blocks (attn_v), Q4_1's (ffn_gate)
    assert max(out for _, out in decoded) == 16 and len(decoded) > 2 * model.config.n_layers  # each of several chunks
    assert torch.equal(Engine(model, 64).logits(ids), want)


def test_a_warm_start_reads_no_header_and_a_rewritten_header_is_indexed_again(llama, tmp_path, monkeypatch):
    """The cache key holds a hash of the file's first MiB besides its size and time: a warm start parses nothing
    (GGUFReader is not called), and a file rewritten in place, its size and time kept, is indexed again."""
    import os
    import shutil

    from engine.checkpoint import gguf_convert

    gguf_file, _, _ = llama
    f = tmp_path / "m.gguf"
    shutil.copyfile(gguf_file, f)
    first = gguf_convert.cached(f, tmp_path / "cache", progress=lambda s: None)
    opened = []
    monkeypatch.setattr(gguf_convert, "open_gguf", lambda path, real=gguf_convert.open_gguf: opened.append(path)
                        or real(path))
    assert gguf_convert.cached(f, tmp_path / "cache", progress=lambda s: None) == first and not opened
    st = f.stat()
    data = bytearray(f.read_bytes())
    at = data.index(b"llama.context_length") + len(b"llama.context_length") + 4  # its uint32 value
    data[at:at + 4] = (int.from_bytes(data[at:at + 4], "little") + 1).to_bytes(4, "little")
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    again = gguf_convert.cached(f, tmp_path / "cache", progress=lambda s: None)
    assert again != first and opened == [f.resolve()]


def test_a_load_takes_the_tokenizers_facts_from_the_cache_and_parses_an_edited_one(llama, tmp_path, monkeypatch):
    """The converter keeps the vocabulary's size and the end ids beside the tokenizer it wrote: a load parses no
    tokenizer and gets a parse's facts; a folder whose tokenizer or configs changed since is parsed again."""
    import json
    import shutil

    from engine import tokenizer
    from engine.checkpoint import gguf_convert

    gguf_file, _, cache = llama
    folder = gguf_convert.cached(gguf_file, cache, progress=lambda s: None)
    parsed = tokenizer.Tokenizer(folder)
    want = (parsed.vocab_size, tuple(sorted(parsed.eos_ids)))
    assert tokenizer.facts(folder) == want and want[1]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)  # times kept: the facts still stand for the copy

    def no_parse(self, path, built=None):
        raise AssertionError(f"{path}'s tokenizer was parsed")

    with monkeypatch.context() as m:
        m.setattr(tokenizer.Tokenizer, "__init__", no_parse)
        assert quiet(gguf_file, cache_dir=cache).eos_ids == want[1]
        assert tokenizer.facts(copy) == want
        generation = json.loads((copy / "generation_config.json").read_text())
        generation["eos_token_id"] = [*want[1], 7]
        (copy / "generation_config.json").write_text(json.dumps(generation))
        with pytest.raises(AssertionError, match="parsed"):
            tokenizer.facts(copy)
    assert tokenizer.facts(copy) == (want[0], tuple(sorted({*want[1], 7})))


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8", "q4", "q4_a8", "q4_0", "q4_k", "q6_k"])
def test_a_files_blocks_in_another_format_are_converted_a_chunk_at_a_time(llama, fmt, monkeypatch):
    """Loaded in a format other than its own (weights=, the Compare panel's formats), a file's blocks are read,
    converted and packed for the CPU kernels a chunk of rows at a time: no projection is read whole (a 1.5B
    Q4_K_M's tied head in q4 held 678 MB of transients), and every weight holds the values of the torch twins'
    load, which converts each tensor whole and packs the concatenated Blocks."""
    gguf_file, values, cache = llama
    want = quiet(gguf_file, weights=fmt, fused=False, cache_dir=cache)
    whole, raw, raw_chunks = [], sources.GGUFSource.raw, sources.GGUFSource.raw_chunks
    seen = []

    def small(self, name, _=0):
        for chunk in raw_chunks(self, name, 1024):
            seen.append(len(chunk))
            yield chunk

    monkeypatch.setattr(sources.GGUFSource, "raw", lambda self, name: whole.append(name) or raw(self, name))
    monkeypatch.setattr(sources.GGUFSource, "raw_chunks", small)
    got = quiet(gguf_file, weights=fmt, cache_dir=cache)
    monkeypatch.undo()
    if got.ops.layout != "cpu":
        pytest.skip("the CPU kernels do not run here")
    assert not [n for n in whole if n.endswith("proj.weight") or n == "lm_head.weight"], whole
    # a panel of 16 rows a chunk, a head of 64 rows for the q / k rows put back in HF order; every projection in
    # several chunks
    assert max(seen) == 64 and 16 in seen and len(seen) > 7 * got.config.n_layers
    for a, b in zip(want.linears(), got.linears(), strict=True):
        for s, t in zip(a.weight.segments, b.weight.segments, strict=True):
            assert (s.fmt, t.layout) == (t.fmt, "cpu") and all(x.is_contiguous() for x in t.tensors)
            assert torch.equal(weights.dequantize(weights.unpack(s)), weights.dequantize(weights.unpack(t)))
    # the parts whose blocks the format holds or converts exactly are the file's values (the twins share the
    # conversion code, so this is what tells a conversion from a re-quantization)
    from engine.checkpoint.formats import CONVERSIONS, holds

    state, exact = load_file(values / "model.safetensors"), 0
    for layer in range(got.config.n_layers):
        for ours, parts in PARTS.items():
            w = got.get_submodule(f"layers.{layer}.{ours}").weight
            w = torch.cat([weights.dequantize(weights.unpack(s)) for s in w.segments])
            row = 0
            for hf, kind in parts:
                v, stored = state[f"model.layers.{layer}.{hf}.weight"], weights.BY_GGUF[MIX[kind]]
                converts = CONVERSIONS.get((stored, fmt), (None, "rounds"))[1] is None
                if not weights.get(fmt).quantized or holds(fmt, stored) or converts:
                    assert torch.equal(w[row:row + len(v)], v.to(weights.get(fmt).dtype or v.dtype).float()), hf
                    exact += 1
                row += len(v)
    assert exact >= got.config.n_layers  # each format holds at least one of the mix's types


@pytest.mark.parametrize("gtype, fmt", [("F16", "fp16"), ("BF16", "bf16")])
def test_a_16_bit_file_keeps_its_dtype_and_gives_its_fp32_widenings_bits(tmp_path, gtype, fmt):
    """A GGUF's F16 / BF16 matrices (and an HF folder's float16 / bfloat16 ones) run in their own dtype on the CPU
    kernels, half the bytes of fp32, the untied embedding too: the kernels widen each weight exactly as they read
    it, so the logits are the fp32 load's (weights="fp32": the projections widened at load) bit for bit."""
    from gguf_files import family_config, write_gguf
    from engine.tiny import write_tiny_model

    path = tmp_path / "m.gguf"
    write_gguf(write_tiny_model(tmp_path / "hf", family_config("llama"), seed=3), path, {k: gtype for k in MIX})
    folder = write_tiny_model(tmp_path / "hf16", family_config("llama"), seed=3, dtype=weights.DENSE_DTYPES[fmt])
    ids = list(range(3, 40))
    for source in (path, folder):
        model = quiet(source, cache_dir=tmp_path / "cache")
        if model.ops.name != "fused":
            pytest.skip("the CPU kernels do not run here")
        wide = quiet(source, weights="fp32", cache_dir=tmp_path / "cache")
        assert {s.fmt for m in model.linears() for s in m.weight.segments} == {fmt} and model.format == fmt
        assert model.embed.weight.dtype == weights.DENSE_DTYPES[fmt]  # as a block file's stays in its blocks
        assert 2 * model.weight_bytes < 1.1 * wide.weight_bytes
        assert torch.equal(Engine(model, 64).logits(ids), Engine(wide, 64).logits(ids))
    notes = " ".join(quiet(path, cache_dir=tmp_path / "cache").load_notes)
    assert f"{gtype} as {fmt} (15)" in notes and f"the embedding stays in {fmt}" in notes
