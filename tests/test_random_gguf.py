"""bench/random_gguf.py's vocabulary padding: Qwen2.5's shapes carry 151936 embedding rows, SmolLM2's tokens then
unused [PAD] ones, as llama.cpp pads Qwen2.5's own vocabulary. (The writer's files through our converter and
llama.cpp: tests/test_bench_llamacpp.py.)"""
from __future__ import annotations

import pytest

from bench import random_gguf
from engine import Engine, load_model
from engine.checkpoint import default_model
from engine.tokenizer import Tokenizer
from tests.test_bench_llamacpp import TINY, TINY_VOCAB  # the writer tests' tiny shape and vocabulary


def test_a_padded_vocabulary_loads_with_its_rows_and_the_same_tokens(tmp_path):
    """random_gguf.padded appends [PAD{i}] tokens of llama.cpp's UNUSED type; our loader takes every row as the
    model's and tokenizes as the unpadded file does; a vocabulary below the tokenizer's is refused."""
    tok = random_gguf.tokenizer_fields(default_model.gguf_path(progress=lambda msg: None), vocab=TINY_VOCAB)
    rows = TINY_VOCAB + 40
    wide = random_gguf.padded(tok, rows)
    assert wide["tokens"][TINY_VOCAB:TINY_VOCAB + 2] == [f"[PAD{TINY_VOCAB}]", f"[PAD{TINY_VOCAB + 1}]"]
    assert wide["token_type"][TINY_VOCAB:] == [random_gguf.UNUSED] * 40 and len(wide["tokens"]) == rows
    with pytest.raises(ValueError, match="below the tokenizer's 512 tokens"):
        random_gguf.padded(tok, TINY_VOCAB - 1)
    random_gguf.write(tmp_path, "wide", TINY, wide, kinds=("F32",), progress=lambda msg: None)
    random_gguf.write(tmp_path, "tiny", TINY, tok, kinds=("F32",), progress=lambda msg: None)
    cache = tmp_path / "cache"
    padded = load_model(random_gguf.path(tmp_path, "wide", "F32"), cache_dir=cache, progress=lambda msg: None)
    plain = load_model(random_gguf.path(tmp_path, "tiny", "F32"), cache_dir=cache, progress=lambda msg: None)
    assert padded.config.vocab_size == rows and plain.config.vocab_size == TINY_VOCAB
    ids = Tokenizer(padded.path).encode("the cat sat on the mat")
    assert ids == Tokenizer(plain.path).encode("the cat sat on the mat") and max(ids) < TINY_VOCAB
    assert Engine(padded, max_seq_len=32).logits(ids).shape == (len(ids), rows)


def test_a_kquant_file_is_made_in_a_folder_that_does_not_exist_yet(tmp_path, monkeypatch):
    """kquant_file makes its folder (bench.paired_decode and scripts/cpu_check.py name one that a new machine lacks),
    runs llama-quantize on the F16 file and removes the F16 file; llama-quantize here is a stand-in that copies."""
    from bench import llamacpp

    quantize = tmp_path / "llama-quantize"
    quantize.write_text('#!/bin/sh\ncp "$1" "$2"\n')
    quantize.chmod(0o755)
    monkeypatch.setattr(llamacpp, "quantize_binary", lambda: quantize)
    monkeypatch.setitem(random_gguf.SHAPES, "tiny", TINY)  # the tokenizer's 49,152 rows
    folder = tmp_path / "not" / "yet"
    out = random_gguf.kquant_file("tiny", folder, progress=lambda msg: None)
    assert out == random_gguf.path(folder, "tiny", "Q4_K_M") and out.stat().st_size > 0
    assert sorted(p.name for p in folder.iterdir()) == [out.name]  # the F16 file removed
