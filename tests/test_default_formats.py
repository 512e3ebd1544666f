"""The formats the default model's GGUF file loads in: q4, the file's Q4_1 blocks exactly (16-bit activations on a
CPU), and what a load that names no format runs (checkpoint/formats.py FILE_RECIPE: q4_a8 on a CPU, q4 on CUDA)."""
import dataclasses

import pytest
import torch

from engine import Engine, load_model
from engine.checkpoint import formats
from engine.checkpoint.load import check_folder
from engine.tokenizer import Tokenizer


@pytest.mark.slow
def test_q4_runs_the_files_own_blocks_losslessly(default_model_dir):
    """weights="q4" loads the GGUF's Q4_1 blocks (and its Q8_0 head) unchanged: the same weights as fp32, and the
    same greedy tokens. With the CPU kernels the activations meet those blocks at 16 bits per block of 32 (each
    input within 2^-16 of its block's largest value), which moves logits up to ~25 by at most ~0.01 through 30
    layers (bench/results/quality-cpu.md measures the largest difference over 1000 tokens): atol 0.03."""
    fp32 = Engine(load_model(default_model_dir, weights="fp32"), 256)
    q4 = Engine(load_model(default_model_dir, weights="q4"), 256)
    assert q4.model.weight_format == "q4" and q4.model.weight_bytes < 0.3 * fp32.model.weight_bytes
    ids = Tokenizer(default_model_dir).encode_chat("Name three rivers in Europe.")
    torch.testing.assert_close(q4.logits(ids), fp32.logits(ids), rtol=0, atol=3e-2)
    assert q4.generate(ids, 48)[0] == fp32.generate(ids, 48)[0]


@pytest.mark.slow
def test_a_load_that_names_no_format_runs_the_file_as_llama_cpp_does(default_model_dir):
    """With no weights asked, the file's Q4_1 blocks run as q4_a8 on a CPU (8-bit activation blocks, llama.cpp's
    recipe; checkpoint/formats.py FILE_RECIPE) and its Q8_0 head as int8, the same bytes as q4's; the logits are
    q4_a8's when asked by name, and stay near the exact model's (within what bench/results/quality-cpu-zen4
    measures for llama.cpp's own run of the file). On CUDA the file's Q4_1 stays q4 (its GEMV has no 8-bit path)."""
    default = load_model(default_model_dir)
    if default.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    assert default.weight_format == "q4_a8" and default.lm_head.weight.fmt == "int8"
    assert any("Q4_1 as q4_a8" in n for n in default.load_notes)
    asked = load_model(default_model_dir, weights="q4_a8")
    exact = load_model(default_model_dir, weights="q4")
    assert default.weight_bytes == asked.weight_bytes == exact.weight_bytes
    ids = Tokenizer(default_model_dir).encode_chat("Name three rivers in Europe.")
    got = Engine(default, 256).logits(ids)
    assert torch.equal(got, Engine(asked, 256).logits(ids))
    want = Engine(exact, 256).logits(ids)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9 and (got - want).abs().max() < 3
    cfg, src = check_folder(default_model_dir)
    try:
        name = "model.layers.0.mlp.gate_proj.weight"
        cuda_kernels = dataclasses.replace(default.ops, layout="cuda")  # the CUDA module's layout: q4, not q4_a8
        assert formats.FormatPlan(None, torch.bfloat16, cuda_kernels, src, {}, "cuda").own(name) == "q4"
        assert formats.FormatPlan(None, torch.float32, default.ops, src, {}, "cpu").own(name) == "q4_a8"
    finally:
        src.close()
