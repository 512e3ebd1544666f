"""Stand-in blocks are rounded once (engine/checkpoint/kept.py): a Q4_K_M-like file's Q4_K q and k, merged with a
Q6_K v, run as q6_k blocks re-quantized on the first start and read back from the model cache on the next, bit
for bit; a load that asks for a format keeps nothing; the kept blocks stay a small share of the file."""
import pytest
import torch

from engine import load_model
from engine import weights as wts
from engine.checkpoint import kept
from engine.tiny import tiny_config, write_tiny_model

# Q4_K_M's mix: 4-bit K-quants, 6-bit for attn_v (so q/k/v merge as q6_k), ffn_down and the head
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    from gguf_files import SHAPE, write_gguf

    root = tmp_path_factory.mktemp("kept")
    folder = write_tiny_model(root / "hf", tiny_config("llama", **SHAPE), seed=3)
    write_gguf(folder, root / "m.gguf", Q4_K_M)
    return root / "m.gguf"


def load(path, cache, **kw):
    return load_model(path, cache_dir=cache, progress=lambda s: None, **kw)


def kept_files(cache):
    return list(cache.rglob(kept.FILE))


def test_a_second_start_reads_the_rounded_blocks_back(gguf_file, tmp_path, monkeypatch):
    from engine.checkpoint import load as load_module

    # this tiny file's q and k are a larger share of it than a real model's (~0.05x at 1.5B): keep them all
    monkeypatch.setattr(load_module, "KEEP_SHARE", 1.0)
    first = load(gguf_file, tmp_path)
    if first.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    assert {m.attn.wqkv.weight.fmt for m in first.layers} == {"q6_k"}
    assert any("second rounding" in n for n in first.load_notes)
    (path,) = kept_files(tmp_path)
    assert path.stat().st_size <= gguf_file.stat().st_size

    def no_rounding(*args, **kw):
        raise AssertionError("a kept stand-in was rounded again")

    monkeypatch.setattr(wts, "quantize", no_rounding)
    second = load(gguf_file, tmp_path)
    assert second.load_notes == first.load_notes  # the note still says what the blocks are
    for a, b in zip(first.linears(), second.linears(), strict=True):
        assert a.weight.fmt == b.weight.fmt
        assert all(torch.equal(x, y) for x, y in zip(a.weight.tensors, b.weight.tensors, strict=True))


def test_a_damaged_kept_file_is_rounded_again(gguf_file, tmp_path):
    first = load(gguf_file, tmp_path)
    if first.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    (path,) = kept_files(tmp_path)
    path.write_bytes(b"not a safetensors file")
    second = load(gguf_file, tmp_path)
    for a, b in zip(first.linears(), second.linears(), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.weight.tensors, b.weight.tensors, strict=True))
    assert path.stat().st_size > 100  # rewritten whole


def test_an_asked_format_keeps_nothing(gguf_file, tmp_path):
    load(gguf_file, tmp_path, weights="int8")
    assert kept_files(tmp_path) == []


def test_past_the_budget_nothing_is_kept(gguf_file, tmp_path, monkeypatch):
    from engine.checkpoint import load as load_module

    monkeypatch.setattr(load_module, "KEEP_SHARE", 0.0)
    load(gguf_file, tmp_path)
    assert kept_files(tmp_path) == []


def test_kept_blocks_are_read_without_mapping_the_file(gguf_file, tmp_path, monkeypatch):
    """A mapped file's pages count in RSS until the load ends: the kept blocks are read with plain reads."""
    from pathlib import Path

    from engine.checkpoint import load as load_module

    maps = Path("/proc/self/maps")
    if not maps.is_file():
        pytest.skip("needs /proc/self/maps (Linux) to see what the process maps")
    monkeypatch.setattr(load_module, "KEEP_SHARE", 1.0)
    first = load(gguf_file, tmp_path)
    if first.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    (path,) = kept_files(tmp_path)
    get, reads = kept.Kept.get, []

    def get_and_look(self, name, fmt, make):
        blocks = get(self, name, fmt, lambda: pytest.fail(f"{name} was rounded again"))
        reads.append(str(path) in maps.read_text())
        return blocks

    monkeypatch.setattr(kept.Kept, "get", get_and_look)
    load(gguf_file, tmp_path)
    assert reads and not any(reads)
