"""Bad input fails before any work, with a message that names the value and says what to do."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, ModelLoadError, load_model
from engine.tiny import tiny_config, write_tiny_model


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


def test_a_tokenizer_larger_than_the_vocabulary_is_named(folder):
    """Ids past config.json's vocab_size would index past the embeddings: a tokenizer of another model."""
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] = 200
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(folder / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = weights[name][:200].contiguous()
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"tokenizer.json has 259 tokens but config.json's vocab_size is 200.*"
                                             r"copy the model's own tokenizer.json there"):
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


# --- weight formats -----------------------------------------------------------------------------------


def test_unknown_weight_format_names_the_value(folder):
    with pytest.raises(ModelLoadError, match=r"weights='q3'.*fp32, fp16, bf16, int8, q4"):
        load_model(folder, weights="q3")


def snapped_folder(tmp_path, fmt: str):
    """A tiny model whose weights already sit on the format's grid (as the default model's fp32 weights sit on
    its Q4_1 / Q8_0 grid), so loading it in that format must change nothing."""
    from engine import weights

    folder = write_tiny_model(tmp_path / fmt, tiny_config(tie_word_embeddings=True))
    tensors = load_file(folder / "model.safetensors")
    for name, t in tensors.items():
        if t.dim() == 2:
            # a q4 model's head: Q8_0 blocks
            grid = "int8" if fmt == "q4" and name == "model.embed_tokens.weight" else fmt
            tensors[name] = weights.dequantize(weights.quantize(t, grid))
    save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("fmt, bound", [("fp16", 1e-5), ("q4", 1e-3), ("int8", 0.08)])
def test_each_format_is_exact_on_weights_already_on_its_grid(tmp_path, fmt, bound, fused):
    """fp16 leaves the activations exact: fp32 accumulation in another order is all that may differ, 1e-5 of the
    logits' spread. int8 on a CPU also quantizes the activations to 8 bits per block of 32 (as llama.cpp's Q8_0
    does): ~1/254 of each block's largest activation, ~5 % of the spread here; q4 (its head in q8) to 16 bits,
    ~1/65534 of it, 258 times finer: ~2e-4 of the spread (the kernels against their twins, exactly where nothing
    rounds, are tests/test_kernels_cpu.py's)."""
    folder = snapped_folder(tmp_path, fmt)
    ids = list(range(3, 40))
    want = Engine(load_model(folder, weights="fp32"), 64).logits(ids)
    model = load_model(folder, weights=fmt, fused=fused)
    assert model.weight_format == fmt and model.lm_head.weight.fmt == ("q8" if fmt == "q4" else fmt)
    got = Engine(model, 64).logits(ids)
    assert (got - want).abs().max().item() <= bound * want.std().item() + 1e-6


@pytest.mark.parametrize("fmt, bound", [("fp16", 0.005), ("bf16", 0.04), ("int8", 0.1), ("q4", 1.0)])
def test_formats_on_random_weights_stay_near_fp32(folder, fmt, bound):
    """Off the grid each format rounds every weight: fp16 ~2^-11, bf16 ~2^-8 of it, int8 ~1/254 and q4 ~1/30 of
    its block's range, which for random normal weights is several std (q4's error is then as large as the
    spread of random logits: the bound only catches a broken path, the grid test above checks exactness)."""
    ids = list(range(3, 40))
    want = Engine(load_model(folder, weights="fp32"), 64).logits(ids)
    got = Engine(load_model(folder, weights=fmt), 64).logits(ids)
    assert (got - want).abs().max().item() <= bound * want.std().item()


def test_a_format_without_a_cpu_kernel_is_named(monkeypatch):
    """Every format has a CPU kernel today; one without (its record has no "cpu" layout) is refused on the kernels by
    name, with the way to run its twin and the formats that do run."""
    import dataclasses
    from types import SimpleNamespace

    from engine import weights
    from engine.checkpoint.formats import pick_format

    bf16 = weights.REGISTRY["bf16"]
    monkeypatch.setitem(weights.REGISTRY, "bf16", dataclasses.replace(
        bf16, layouts={k: v for k, v in bf16.layouts.items() if k != "cpu"}))
    with pytest.raises(ModelLoadError, match=r"weights='bf16' has no CPU kernel; its torch twin runs it with "
                                             r"fused=False \(--no-fused\), or pick one of fp32, fp16, int8, q4"):
        pick_format("bf16", torch.float32, SimpleNamespace(layout="cpu"))


def test_weight_bytes_follow_the_format(folder):
    sizes = {f: load_model(folder, weights=f).weight_bytes for f in ("fp32", "fp16", "int8", "q4")}
    assert sizes["fp32"] > 1.9 * sizes["fp16"] > 1.7 * sizes["int8"] > sizes["q4"]


def test_switching_kernels_repacks_exactly(folder):
    """use_fused moves every weight between layouts; the logits must not move at all."""
    eng = Engine(load_model(folder, weights="q4"), 64)
    ids = list(range(3, 20))
    a = eng.logits(ids)
    eng.use_fused(not (eng.model.ops.name == "fused"))
    eng.use_fused(not (eng.model.ops.name == "fused"))
    torch.testing.assert_close(eng.logits(ids), a, rtol=0, atol=0)
