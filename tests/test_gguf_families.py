"""GGUF files of every family we convert (written by tests/gguf_files.py as llama.cpp writes them, with a
Q4_K_M-like mix of block types), read in place and run against transformers on the values the file stands for;
every tensor runs its own blocks (a merged projection whose parts differ in type in a segment each), and a note
names every tensor that does not.

Tolerances: the fp32 load and the reference compute the same fp32 graph on the same values (the twins give
gguf's own dequantization bit for bit, tests/test_gguf_weights.py): 1e-4 as tests/family_checks.py. The
native load runs int8 blocks against 8-bit activations (W8A8), ~1/254 of each block's largest activation:
within 0.25 of the logits' spread here, a bound that only catches a broken path (the blocks' exactness is
checked directly).
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from engine import Engine, load_model
from engine.checkpoint import gguf_convert
from family_checks import ref_logits, reference
from gguf_files import CONFIGS, family_files
from stacked import dequantized

FAMILIES = list(CONFIGS)
# transformers' own GGUF loader reads these files as llama.cpp does (it ignores Llama 3's rope_freqs, and its Phi-3
# config keeps a pad id outside a small vocabulary): an independent second reference
TRANSFORMERS_READS = ("qwen2", "qwen3", "gemma3_text", "gemma2")
IDS = list(range(3, 43))


@pytest.fixture(scope="module", params=FAMILIES)
def files(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    gguf_file, values = family_files(request.param, root)
    return request.param, gguf_file, values, root / "cache"


def test_fp32_matches_transformers_on_the_files_values(files):
    family, gguf_file, values, cache = files
    want = ref_logits(reference(values), IDS)
    eng = Engine(load_model(gguf_file, weights="fp32", cache_dir=cache, progress=lambda s: None), 128)
    torch.testing.assert_close(eng.logits(IDS), want, atol=1e-4, rtol=1e-4)
    with torch.inference_mode():  # the cached path (the native block loop where the family runs it)
        eng.prefill(IDS[:10])
        steps = torch.stack([eng.decode(torch.tensor([t]))[0] for t in IDS[10:]])
    torch.testing.assert_close(steps[:-1], want[10:-1], atol=1e-4, rtol=1e-4)
    if family in TRANSFORMERS_READS:
        import transformers

        theirs = transformers.AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                                    dtype=torch.float32).eval()
        torch.testing.assert_close(eng.logits(IDS), ref_logits(theirs, IDS), atol=1e-4, rtol=1e-4)


def test_native_load_keeps_the_files_blocks_and_names_the_rest(files):
    family, gguf_file, values, cache = files
    said = []
    model = load_model(gguf_file, cache_dir=cache, progress=said.append)
    if model.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here: a native load runs the twins")
    ref = load_file(values / "model.safetensors")
    attn, mlp = model.layers[0].attn, model.layers[0].mlp

    def values_of(linear):
        return dequantized(linear.weight)

    def formats(linear):
        return tuple(s.fmt for s in linear.weight.segments)

    if family != "phi3":  # q, k (Q5_0) and v (Q8_0) each in the file's blocks: their values, bit for bit
        assert formats(attn.wqkv) == ("q5_0", "int8")
        parts = [ref[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]
        assert torch.equal(values_of(attn.wqkv), torch.cat(parts))
        # gate (Q4_1) and up (Q4_0): a segment each, in its own blocks, exactly; Q4_1 as llama.cpp runs it on a
        # CPU, against 8-bit activation blocks (q4_a8; checkpoint/formats.py FILE_RECIPE)
        assert formats(mlp.w_gate_up) == ("q4_a8", "q4_0")
        parts = [ref[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up")]
        assert torch.equal(values_of(mlp.w_gate_up), torch.cat(parts))
    # Q4_K and Q6_K run as themselves on the CPU kernels: the file's blocks, their values bit for bit
    for linear, name in ((attn.wo, "self_attn.o_proj"), (mlp.w_down, "mlp.down_proj")):
        assert linear.weight.fmt in ("q4_k", "q6_k")
        assert torch.equal(values_of(linear), ref[f"model.layers.0.{name}.weight"])
    assert (attn.wo.weight.fmt, mlp.w_down.weight.fmt) == ("q4_k", "q6_k")
    notes = " ".join(model.load_notes)
    assert model.load_notes and all(n in said for n in model.load_notes)
    assert "runs the file's own blocks: " in notes and "Q4_K" in notes and "Q6_K" in notes
    assert "second rounding" not in notes
    want = Engine(load_model(gguf_file, weights="fp32", cache_dir=cache, progress=lambda s: None), 128).logits(IDS)
    got = Engine(model, 128).logits(IDS)
    assert (got - want).abs().max().item() <= 0.25 * want.std().item()


def test_an_asked_format_says_what_it_rounds_again(files):
    family, gguf_file, values, cache = files
    model = load_model(gguf_file, weights="q4", cache_dir=cache, progress=lambda s: None)
    notes = " ".join(model.load_notes)
    assert "re-quantized to q4 from their dequantized values (weights='q4')" in notes
    assert "ffn_down.weight (Q6_K)" in notes and "converted to q4 blocks (weights='q4')" in notes
    assert "attn_output.weight (Q4_K)" in notes and "(Q4_1)" not in notes.split("converted")[-1]


def test_the_cached_folder_holds_no_weights(files):
    """The model cache keeps the config, the tokenizer and the file's index: the weights are read from the file."""
    family, gguf_file, values, cache = files
    folder = gguf_convert.cached(gguf_file, cache, progress=lambda s: None)
    index = json.loads((folder / "gguf.json").read_text())
    assert index["tensors"]["model.layers.1.self_attn.o_proj.weight"][:2] == ["blk.1.attn_output.weight", "Q4_K"]
    assert not list(folder.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in folder.iterdir()) < 0.2 * gguf_file.stat().st_size
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == family and config["architectures"] == [load_model(
        folder, weights="fp32").config.family.architecture]
