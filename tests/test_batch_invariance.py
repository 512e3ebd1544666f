"""Batch-invariant numerics on the CPU kernels: a position's logits are the same bits whichever pass computes
it, a decode step or a verify pass of any T = 1..17, so greedy speculative output cannot depend on the k a round
chose. Every weight format (fp32, fp16, int8, q4 with its q8 head, the K-quants on Q8_K activations, q4_0 and
q5_0), every instruction-set path this CPU runs (amx with its tiles from one row up, and at its default
crossover), the native block loop and Block.forward in Python, full and windowed attention; compared with
torch.equal, no tolerance."""
from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.checkpoint import random_model
from engine.ops import ext
from engine.tiny import tiny_config

pytestmark = pytest.mark.skipif(ext.load("cpu").module is None, reason="the CPU kernels did not build")

FORMATS = ["fp32", "fp16", "int8", "q4", "q4_k", "q5_k", "q6_k", "q4_0", "q5_0"]
SHAPES = {  # head_dim 16 runs attention's generic path; 64 its unrolled one. 352 = 11 blocks, a ragged panel count
    "tiny": dict(),
    "wide": dict(hidden_size=128, intermediate_size=352, num_attention_heads=2, num_key_value_heads=1,
                 num_hidden_layers=2),
}
PROMPT, MAX_T = 300, 17  # the prompt crosses several of attention's key splits (kernels.h split_start)


def paths(module):
    """(name, setup) for every path this CPU runs; setup() switches the module to it."""
    best, rows = module.isa().split()[0], module.amx_rows()
    cases = [("avx2", "avx2", rows), ("avx512", "avx512", rows), ("amx tiles at every T", "amx", 1),
             (f"amx from T >= {rows}", "amx", rows)]
    try:
        for name, isa, amx_rows in cases:
            try:
                module.set_isa(isa)
            except RuntimeError:
                continue
            module.set_amx_rows(amx_rows)
            yield name
    finally:
        module.set_isa(best)
        module.set_amx_rows(rows)


@torch.inference_mode()
def decode_then_verify(eng: Engine, prompt: list[int], tokens: torch.Tensor) -> None:
    """Logits of MAX_T positions from decode steps, then from a verify pass of every T on the same positions."""
    eng.prefill(prompt)
    steps = torch.stack([eng.decode(tokens[:, t])[0] for t in range(MAX_T)])  # [MAX_T, V]
    assert torch.isfinite(steps).all()
    for T in range(1, MAX_T + 1):
        eng.rollback(len(prompt))
        chunk = eng.chunk(tokens[:, :T])[0]
        for t in range(T):
            assert torch.equal(chunk[t], steps[t]), (T, t, (chunk[t] - steps[t]).abs().max().item())


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_steps_and_verify_passes_give_the_same_bits(fmt, shape):
    module = ext.load("cpu").module
    model = random_model(tiny_config(**SHAPES[shape]), weights=fmt, seed=7)
    assert model.ops.blocks is not None, model.ops.reason
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT,), generator=g).tolist()
    tokens = torch.randint(0, model.config.vocab_size, (1, MAX_T), generator=g)
    eng = Engine(model, max_seq_len=PROMPT + MAX_T + 8)
    for path in paths(module):
        for window in (None, 64):
            eng.use_window(window, sinks=4)
            try:
                decode_then_verify(eng, prompt, tokens)
                with model.blocks_in_python():
                    decode_then_verify(eng, prompt, tokens)
            except AssertionError as e:
                raise AssertionError(f"{fmt} {shape} on {path}, window {window}: {e}") from None


@pytest.mark.slow
def test_the_default_model_in_q4(default_model_dir):
    """The launch most users get: the default model in q4 (its q8 head on 16-bit activations too), on the path
    this CPU picks, over a real prompt."""
    from engine import Tokenizer, load_model

    model = load_model(default_model_dir, weights="q4")
    tok = Tokenizer(default_model_dir)
    prompt = tok.encode("The history of the lighthouse keepers on the northern coast " * 12)
    text = " and the long winter nights they spent watching the sea, alone with the lamp and the logbook"
    tokens = torch.tensor([tok.encode(text)[:MAX_T]])
    assert tokens.shape[1] == MAX_T
    decode_then_verify(Engine(model, max_seq_len=len(prompt) + MAX_T + 8), prompt, tokens)
