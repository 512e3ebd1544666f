"""Batch-invariant numerics: a position's logits are the same bits whichever pass computes it, a decode step or a
verify pass of any T = 1..17, so greedy speculative output cannot depend on the k a round chose; compared with
torch.equal, no tolerance, full and windowed attention.

CPU kernels: every weight format (fp32, fp16, bf16, int8, q4 with its q8 head, the K-quants on Q8_K activations, q4_0,
q5_0 and q5_1) and merged weights stacked in segments of two formats, every instruction-set path this CPU runs (amx
with its tiles from one row up, and at its default crossover), the native block loop and Block.forward in Python. CUDA
kernels (on a GPU, and on the CPU emulation of CUDA threads): every format the GEMV runs (int8, q4 with its q8 head,
and dense fp16 / bf16, whose products are the GEMV at every T up to 17, and q4 and int8 segments of one stacked
weight) and the split-KV attention at every T, in bf16 and fp32 activations. fp32 weights on CUDA multiply with
cuBLAS, which promises no fixed order across row counts: not covered here (engine/ops/cuda.py). A prefill (more
than 17 rows) runs cuBLAS too; its logits are never compared with a decode step's."""
from __future__ import annotations

import pytest
import torch

from cuda_backends import make_backend
from engine import Engine, ops
from engine.checkpoint import random_model
from engine.ops import ext
from engine.tiny import tiny_config, tiny_cuda_config
from stacked import PAIRS, restack, stacked_model



@pytest.fixture(scope="module")
def cpu_module():
    """Asked for only by the CPU tests, so a run of the CUDA ones never builds the CPU kernels."""
    module = ext.load("cpu").module
    if module is None:
        pytest.skip("the CPU kernels did not build")
    return module

FORMATS = ["fp32", "fp16", "bf16", "int8", "q4", "q4_a8", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_0", "q5_0",
           "q5_1"]
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
def decode_then_verify(eng: Engine, prompt: list[int], tokens: torch.Tensor,
                       lengths=range(1, MAX_T + 1)) -> None:
    """Logits of MAX_T positions from decode steps, then from a verify pass of each T on the same positions."""
    eng.prefill(prompt)
    steps = torch.stack([eng.decode(tokens[:, t])[0] for t in range(MAX_T)])  # [MAX_T, V]
    assert torch.isfinite(steps).all()
    for T in lengths:
        eng.rollback(len(prompt))
        chunk = eng.chunk(tokens[:, :T])[0]
        for t in range(T):
            assert torch.equal(chunk[t], steps[t]), (T, t, (chunk[t] - steps[t]).abs().max().item())


def engine_and_inputs(model, seed: int):
    """An engine over `model` with room for the prompt and MAX_T more, a PROMPT-token prompt and MAX_T tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT,), generator=g).tolist()
    tokens = torch.randint(0, model.config.vocab_size, (1, MAX_T), generator=g)
    return Engine(model, max_seq_len=PROMPT + MAX_T + 8), prompt, tokens


def natively_and_in_python(eng: Engine, model, prompt: list[int], tokens: torch.Tensor, where: str) -> None:
    """decode_then_verify with the native block loop, then with Block.forward; a failure says `where`."""
    try:
        decode_then_verify(eng, prompt, tokens)
        with model.blocks_in_python():
            decode_then_verify(eng, prompt, tokens)
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_steps_and_verify_passes_give_the_same_bits(cpu_module, fmt, shape):
    module = cpu_module
    model = random_model(tiny_config(**SHAPES[shape]), weights=fmt, seed=7)
    assert model.ops.blocks is not None, model.ops.reason
    eng, prompt, tokens = engine_and_inputs(model, seed=1)
    for path in paths(module):
        for window in (None, 64):
            eng.use_window(window, sinks=4)
            natively_and_in_python(eng, model, prompt, tokens, f"{fmt} {shape} on {path}, window {window}")


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_stacked_weights_give_the_same_bits(cpu_module, pair):
    """q/k and v, gate and up in two formats (a GGUF file's mix, each part in its own blocks): each segment's kernel
    is batch-invariant, and so is the weight they make, natively and in Python, on every path."""
    # "wide"'s heads, with up's segment starting inside a panel (stacked.SHAPE)
    model = stacked_model(*pair, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)
    eng, prompt, tokens = engine_and_inputs(model, seed=2)
    for path in paths(cpu_module):
        natively_and_in_python(eng, model, prompt, tokens, f"{pair} on {path}")


@pytest.mark.slow
def test_the_default_model_in_q4(cpu_module, default_model_dir):
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


CUDA_FORMATS = ["int8", "q4", "fp16", "bf16"]  # the formats a user picks that the GEMV runs (q4 brings its q8 head)
CUDA_PROMPT = 200  # fp32 at head_dim 64: 32 keys a tile, 2 tiles a split at least, so several splits
# The emulation runs every CUDA thread as a coroutine: one layer, and the verify lengths that reach each of the
# GEMV's token tiles (1, 2, 4, 8, 16) and two launches (17 = 16 + 1); the GPU runs every T and four layers.
EMULATED_LENGTHS = (1, 2, 3, 5, 9, 17)
EMULATED_DENSE_LENGTHS = (1, 2, 9, 17)  # the dense tile shares the block formats' tiling: fewer lengths


# On the emulation q8 adds nothing to int8 (the same kernel, activations in their dtype): one case per product
# kernel, in bf16 or the fp32 that shows any change of order.
CUDA_CASES = [
    pytest.param(name, fmt, dtype, id=f"{name}-{fmt}-{dtype}",
                 marks=[pytest.mark.emulation] if name == "emulated" else [])
    for name, cases in [("cuda", [(f, d) for f in CUDA_FORMATS for d in ("bf16", "fp32")]),
                        ("emulated", [("int8", "bf16"), ("q4", "fp32"), ("fp16", "fp32"), ("bf16", "bf16")])]
    for fmt, dtype in cases
]


@pytest.fixture(scope="module")
def backend(request):
    return make_backend(request.param)


def cuda_model(backend, fmt: str, dtype: str):
    """A random head_dim-64 model on the CUDA kernels: the extension on a GPU, the emulated kernels on a CPU."""
    cfg = tiny_cuda_config(num_hidden_layers=4 if backend.name == "cuda" else 1)
    if backend.name == "cuda":
        return random_model(cfg, device="cuda", dtype=dtype, weights=fmt, seed=7)
    model = random_model(cfg, dtype=dtype, weights=fmt, fused=False, seed=7)
    model.use_ops(ops.cuda_ops(backend.module, "the CUDA kernels on the CPU emulation"))
    return model


@pytest.mark.parametrize("backend,fmt,dtype", CUDA_CASES, indirect=["backend"])
def test_cuda_decode_steps_and_verify_passes_give_the_same_bits(backend, fmt, dtype):
    model = cuda_model(backend, fmt, dtype)
    assert model.ops.name == "fused" and model.ops.layout == "cuda", model.ops.reason
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (CUDA_PROMPT,), generator=g).tolist()
    tokens = torch.randint(0, model.config.vocab_size, (1, MAX_T), generator=g).to(backend.device)
    eng = Engine(model, max_seq_len=CUDA_PROMPT + MAX_T + 8)
    lengths = (range(1, MAX_T + 1) if backend.name == "cuda" else
               EMULATED_DENSE_LENGTHS if fmt in ("fp16", "bf16") else EMULATED_LENGTHS)
    for window in (None, 64):
        eng.use_window(window, sinks=4)
        try:
            decode_then_verify(eng, prompt, tokens, lengths)
        except AssertionError as e:
            raise AssertionError(f"{fmt} {dtype} on {backend.name}, window {window}: {e}") from None


@pytest.mark.parametrize("backend", ["cuda", pytest.param("emulated", marks=pytest.mark.emulation)], indirect=True)
def test_cuda_stacked_weights_give_the_same_bits(backend):
    """q/k and v, gate and up in q4 and int8 segments, each on its own GEMV, their outputs joined: a decode step
    and a verify pass still agree bit for bit."""
    model = restack(cuda_model(backend, "q4", "fp32"), "q4", "int8")
    assert type(model.layers[0].attn.wqkv.weight).__name__ == "Stacked" and model.ops.layout == "cuda"
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, model.config.vocab_size, (CUDA_PROMPT,), generator=g).tolist()
    tokens = torch.randint(0, model.config.vocab_size, (1, MAX_T), generator=g).to(backend.device)
    eng = Engine(model, max_seq_len=CUDA_PROMPT + MAX_T + 8)
    decode_then_verify(eng, prompt, tokens, range(1, MAX_T + 1) if backend.name == "cuda" else EMULATED_LENGTHS)
