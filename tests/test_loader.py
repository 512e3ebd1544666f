"""Bad input fails before any work, with a message that names the value and says what to do."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, ModelLoadError, load_model
from engine.tiny import write_tiny_model


@pytest.fixture
def folder(tmp_path):
    return write_tiny_model(tmp_path / "m")


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    return Engine(load_model(write_tiny_model(tmp_path_factory.mktemp("m"))), max_seq_len=64)


def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_unsupported_model_type(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"model_type='gpt2'.*llama"):
        load_model(folder)


def test_missing_tokenizer(folder):
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        load_model(folder)


def test_missing_tensor_is_named(folder):
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(folder)


def test_wrong_shape_names_both_shapes(folder):
    weights = load_file(folder / "model.safetensors")
    weights["model.norm.weight"] = torch.ones(65)
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight.*\[65\].*\[64\]"):
        load_model(folder)


def test_sharded_folder_loads_the_same(folder, tmp_path):
    weights = load_file(folder / "model.safetensors")
    names = sorted(weights)
    shard = tmp_path / "sharded"
    write_tiny_model(shard)
    (shard / "model.safetensors").unlink()
    save_file({n: weights[n] for n in names[::2]}, shard / "model-00001-of-00002.safetensors")
    save_file({n: weights[n] for n in names[1::2]}, shard / "model-00002-of-00002.safetensors")
    ids = list(range(10))
    torch.testing.assert_close(Engine(load_model(shard)).logits(ids), Engine(load_model(folder)).logits(ids))


def test_bf16_load(folder):
    model = load_model(folder, dtype="bf16")
    assert model.dtype == torch.bfloat16
    assert Engine(model, max_seq_len=32).generate([1, 2, 3], max_new_tokens=4)[0]


def test_unknown_dtype(folder):
    with pytest.raises(ModelLoadError, match="'int3'"):
        load_model(folder, dtype="int3")


@pytest.mark.parametrize("kw, word", [
    (dict(prompt_ids=[]), "empty"),
    (dict(prompt_ids=[1] * 60, max_new_tokens=10), r"= 70 exceeds max_seq_len=64"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(temperature=-1.0), "temperature=-1.0"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_k=-2), "top_k=-2"),
    (dict(prompt_ids=[100000]), "100000"),
])
def test_bad_requests_fail_before_work(eng, kw, word):
    args = dict(prompt_ids=[1, 2, 3], max_new_tokens=4) | kw
    with pytest.raises(ValueError, match=word):
        eng.generate(**args)
    assert eng.generate([1, 2, 3], max_new_tokens=2)[0]  # the engine still serves


def test_generation_stops_at_eos(tmp_path):
    model = load_model(write_tiny_model(tmp_path))
    eng = Engine(model, max_seq_len=64)
    ids, _ = eng.generate([1, 2, 3], max_new_tokens=20)
    stop = ids[5]
    cut, stats = eng.generate([1, 2, 3], max_new_tokens=20, stop_ids=[stop])
    assert cut == ids[: ids.index(stop) + 1]
    assert stats.rounds[-1].finished
