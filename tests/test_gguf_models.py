"""GGUF files as models (`--model` / `--draft file.gguf`): converted into the model cache once, keyed so a
changed file is converted again; a tokenizer the converter cannot rebuild fails at once, naming it."""
import os
import shutil

import numpy as np
import pytest
import torch

from engine import Engine, load_model, speculative
from engine.checkpoint import ModelLoadError, resolve_path


def write_gguf(path, tokenizer_model="gpt2", tokenizer_pre="deepseek-coder"):
    """A tiny llama GGUF file whose tokenizer decodescope does not rebuild (a byte-level BPE split by a
    pre-tokenizer it has no table entry for)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tokenizer_the_converter_cannot_rebuild_fails_naming_it(tmp_path):
    f = write_gguf(tmp_path / "coder-like.gguf")
    with pytest.raises(ModelLoadError, match="tokenizer model='gpt2' pre='deepseek-coder'.*HF folder or hub id"):
        load_model(f, cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()]  # nothing half-written left


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        resolve_path(str(tmp_path / "nope.gguf"))


@pytest.mark.slow
def test_the_default_models_gguf_loads_converted_once_and_again_when_changed(tmp_path, default_model_dir):
    """The embedded model's own GGUF file given as a model: the same weights as the default folder (greedy
    tokens identical), converted on the first load only, and again once the file changes."""
    from engine.checkpoint import default_model

    src = tmp_path / "smol.gguf"
    shutil.copy(default_model.gguf_path(), src)
    said = []
    folder = resolve_path(str(src), tmp_path / "cache", progress=said.append)
    assert any("indexed" in s for s in said)
    said.clear()
    assert resolve_path(str(src), tmp_path / "cache", progress=said.append) == folder and not said
    prompt = [1, 504, 3458, 282, 4649, 314]
    want, _ = Engine(load_model(default_model_dir, weights="fp32"), 64).generate(prompt, 12, stop_ids=[])
    model = load_model(src, cache_dir=tmp_path / "cache", weights="fp32")  # fp32, to draft for itself in q4
    got, _ = Engine(model, 64).generate(prompt, 12, stop_ids=[])
    assert got == want
    # a GGUF target drafted by the same file at q4 (its own blocks): the pair the README shows, in miniature
    eng = Engine(model, 64)
    ids, stats = speculative.generate(eng, speculative.self_drafter(eng, "q4"), prompt, k=4, max_new_tokens=12,
                                      stop_ids=[], adaptive=False)
    assert ids == want and stats.summary()["acceptance_rate"] == 1.0
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))  # the file changed
    again = resolve_path(str(src), tmp_path / "cache", progress=said.append)
    assert again != folder and any("indexed" in s for s in said) and not folder.exists()
    assert torch.equal(load_model(again, weights="fp32").lm_head.weight.tensors[0], model.lm_head.weight.tensors[0])
