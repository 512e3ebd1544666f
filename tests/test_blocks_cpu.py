"""The native block loop (csrc/cpu/ops_blocks.cpp, ops.blocks) against Block.forward in Python on the same CPU
kernels: the same kernels in the same order, so logits, the residual stream and the KV cache must be equal
bit for bit, in every weight format, for decode steps and verify passes, batched rows, a bounded kv_limit,
windowed attention, a model with q/k/v biases and merged projections stacked in segments of two formats."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import Engine, families
from engine.ops import ext
from engine.kv_cache import KVCache
from engine.checkpoint import random_model
from engine.tiny import tiny_config
from engine.model import LAYER_FIELDS
from stacked import PAIRS, stacked_model

pytestmark = pytest.mark.skipif(ext.load("cpu").module is None, reason="the CPU kernels did not build")


def python_loop(model):
    """The same OpSet without its native block loop: Transformer.forward then runs Block.forward."""
    return dataclasses.replace(model.ops, blocks=None)


def run(model, ops, tokens, prompt, window=0, sinks=0, kv_limit=None, kv_dtype=torch.float32):
    """Prefill `prompt` rows, then one cached forward of `tokens` [B, T]; logits and the cache."""
    B, T = tokens.shape
    saved, model.ops = model.ops, ops
    try:
        model.ensure_rope(96)
        cache = KVCache(model.config, B, 96, kv_dtype, "cpu")
        cache.set_length(prompt.shape[1])
        model(prompt, cache, "prefill", start=0)
        cache.advance(T)
        logits = model(tokens, cache, "cached", kv_limit=kv_limit, window=window, sinks=sinks,
                       start=cache.length - T)
    finally:
        model.ops = saved
    return logits, cache


def loops_agree(model, tokens, prompt, kws: list[dict], label) -> None:
    """The native loop and Python's under each of `kws` (run's keywords): logits and cache bit for bit; a failure
    names `label`."""
    for kw in kws:
        got, got_cache = run(model, model.ops, tokens, prompt, **kw)
        want, want_cache = run(model, python_loop(model), tokens, prompt, **kw)
        assert torch.isfinite(want).all()
        assert torch.equal(got, want), (label, kw, (got - want).abs().max())
        assert torch.equal(got_cache.k, want_cache.k) and torch.equal(got_cache.v, want_cache.v), kw


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8", "q4"])
@pytest.mark.parametrize("B,T", [(1, 1), (1, 5), (2, 3)])
def test_native_blocks_equal_the_python_loop(fmt, B, T):
    model = random_model(tiny_config(), weights=fmt, seed=3)
    assert model.ops.blocks is not None, model.ops.reason
    g = torch.Generator().manual_seed(B * 10 + T)
    prompt = torch.randint(0, model.config.vocab_size, (B, 37), generator=g)
    tokens = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    loops_agree(model, tokens, prompt, [dict(), dict(kv_limit=64), dict(window=8, sinks=2)], fmt)


@pytest.mark.parametrize("B,T", [(1, 1), (1, 5), (2, 3)])
def test_native_blocks_on_an_fp16_cache_equal_the_python_loop(B, T):
    """An fp16 KV cache: the native loop rounds each K/V value into it as torch's copy does (to nearest, ties to
    even), and attention reads the same values: logits and cache bit for bit, and the cache is fp16's rounding of
    an fp32 cache's values."""
    model = random_model(tiny_config(), weights="q4", seed=3)
    g = torch.Generator().manual_seed(B * 10 + T)
    prompt = torch.randint(0, model.config.vocab_size, (B, 37), generator=g)
    tokens = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    half = dict(kv_dtype=torch.float16)
    loops_agree(model, tokens, prompt, [half, dict(kv_limit=64, **half), dict(window=8, sinks=2, **half)], "fp16 cache")
    _, cache16 = run(model, model.ops, tokens, prompt, **half)
    _, cache32 = run(model, model.ops, tokens, prompt)
    assert cache16.k.dtype == torch.float16
    n = 37 + T
    # the prompt's rows come from the same prefill; the new rows from forwards that read the cache's own values
    assert torch.equal(cache16.k[:, :, :, :37], cache32.k[:, :, :, :37].half())
    assert torch.equal(cache16.v[:, :, :, :37], cache32.v[:, :, :, :37].half())
    torch.testing.assert_close(cache16.k[:, :, :, :n].float(), cache32.k[:, :, :, :n], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_stacked_weights_equal_the_python_loop(pair):
    """A merged projection in row segments of two formats (q/k and v, gate and up): the native loop runs each
    segment's kernel into its slice of the output, Block.forward each segment's matmul and joins them: bit for
    bit."""
    model = stacked_model(*pair)
    qkv = model.layers[0].attn.wqkv.weight
    assert tuple(s.fmt for s in qkv.segments) == pair
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, model.config.vocab_size, (2, 37), generator=g)
    tokens = torch.randint(0, model.config.vocab_size, (2, 3), generator=g)
    loops_agree(model, tokens, prompt, [dict(), dict(window=8, sinks=2)], pair)


FAMILIES = [name for name, f in families.FAMILIES.items() if f.native_blocks and name != "llama"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_each_familys_blocks_equal_the_python_loop(family, fmt):
    """The families' additions to the loop (q/k norms, norms after attention and MLP, GeGLU, each layer's own
    window and rope table) run the same kernels in the same order as Block.forward: bit for bit."""
    model = random_model(tiny_config(family), weights=fmt, seed=5)
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, model.config.vocab_size, (2, 37), generator=g)
    tokens = torch.randint(0, model.config.vocab_size, (2, 3), generator=g)
    loops_agree(model, tokens, prompt, [dict(), dict(window=16, sinks=2)], (family, fmt))


def test_biases_and_the_engine_path():
    model = random_model(tiny_config(model_type="qwen2"), weights="fp32", seed=4)
    assert model.layers[0].attn.wqkv.bias is not None
    prompt = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    tokens = prompt[:, :4]
    got, _ = run(model, model.ops, tokens, prompt)
    want, _ = run(model, python_loop(model), tokens, prompt)
    assert torch.equal(got, want)
    # greedy decoding through the Engine: the native loop runs its steps
    calls = []
    native = model.ops.blocks
    model.ops = dataclasses.replace(model.ops, blocks=lambda *a: calls.append(1) or native(*a))
    ids = prompt[0].tolist()
    fast = Engine(model, max_seq_len=64).generate(ids, 12)[0]
    model.ops = python_loop(model)
    slow = Engine(model, max_seq_len=64).generate(ids, 12)[0]
    assert fast == slow and len(calls) >= 11


def test_hooked_blocks_run_in_python_only_when_asked():
    """The native loop calls no Python per block: whoever hooks the blocks (layer-skip calibration) asks for
    Block.forward with blocks_in_python(), an explicit choice rather than one sniffed from the hooks."""
    model = random_model(tiny_config(), weights="fp32", seed=5)
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(1))
    seen = []
    handle = model.layers[2].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    try:
        run(model, model.ops, prompt[:, :2], prompt)
        assert len(seen) == 1  # the prefill only: the cached forward ran natively
        with model.blocks_in_python():
            run(model, model.ops, prompt[:, :2], prompt)
        assert len(seen) == 3 and not model.python_blocks  # the prefill and the cached forward; the flag restored
    finally:
        handle.remove()


def test_the_native_loop_reads_the_layer_record():
    """The module lists the record's fields in LayerRecord's order, and a model refuses an OpSet whose block loop
    reads other fields, naming both lists."""
    module = ext.load("cpu").module
    assert tuple(module.block_fields()) == LAYER_FIELDS
    model = random_model(tiny_config(), weights="fp32", seed=6)
    stale = dataclasses.replace(model.ops, block_fields=LAYER_FIELDS[:-1])
    with pytest.raises(RuntimeError, match="reads the fields .* but LayerRecord declares .*'eps'"):
        model.use_ops(stale)


def test_bad_input_is_named():
    module = ext.load("cpu").module
    model = random_model(tiny_config(), weights="fp32", seed=6)
    cache = KVCache(model.config, 1, 16, torch.float32, "cpu")
    model.ensure_rope(16)
    ops = model.ops.blocks.__self__
    code = {name: i for i, name in enumerate(module.formats())}
    record = model.layer_records(cache)[0]
    fields = {f.name: ops.native(getattr(record, f.name)) for f in dataclasses.fields(record)}
    w = model.layers[0].attn.wqkv.weight

    def plan(**changed):
        return module.BlockPlan([{k: v for k, v in (fields | changed).items() if v is not None}])

    rows = w.out_features
    with pytest.raises(RuntimeError, match=r"qkv is int8, whose weights are 2 packed tensor\(s\), got 1"):
        plan(qkv=[module.Projection(code["int8"], list(w.tensors), rows)])
    with pytest.raises(RuntimeError, match="unknown weight format code 99"):
        plan(qkv=[module.Projection(99, list(w.tensors), rows)])
    with pytest.raises(RuntimeError, match=f"layer 0: qkv's segments cover {rows + 1} output rows, not its {rows}"):
        plan(qkv=[module.Projection(code["fp32"], list(w.tensors), rows), module.Projection(code["fp32"], list(
            w.tensors), 1)])
    with pytest.raises(RuntimeError, match="layer 0: qkv has no segments"):
        plan(qkv=[])
    with pytest.raises(RuntimeError, match="k_cache and v_cache must be"):
        plan(v_cache=cache.layer_v[0][:, :, :8])
    with pytest.raises(RuntimeError, match="at least one block"):
        module.BlockPlan([])
    with pytest.raises(RuntimeError, match=r"q_norm must be \[D\] = \[16\] or empty, got \[64\]"):
        plan(q_norm=model.norm.weight, k_norm=model.norm.weight)
    with pytest.raises(RuntimeError, match=r"cos and sin must be \[max_pos, D/2\]"):
        plan(cos=model.cos[:, :4])
    with pytest.raises(RuntimeError, match="layer 0: activation must be 'silu' or 'gelu_tanh', got 'relu'"):
        plan(activation="relu")
    # the record by name: a missing field, a field the loop does not read, a field of the wrong kind
    with pytest.raises(RuntimeError, match="layer 0: the record has no field 'eps'"):
        plan(eps=None)
    with pytest.raises(RuntimeError, match="layer 0: the block loop reads no field 'mlp_nrom'"):
        plan(mlp_nrom=torch.zeros(4))
    with pytest.raises(RuntimeError, match="layer 0: window must be an int, got a tensor"):
        plan(window=torch.zeros(1))
    with pytest.raises(RuntimeError, match="layer 0: eps must be a float, got an int"):
        plan(eps=1)
    h = torch.zeros(1, model.config.hidden_size)
    with pytest.raises(RuntimeError, match="must lie below kv_limit = 20, at most the cache's 16"):
        plan().run(h, h, torch.zeros(1, dtype=torch.long), cache.seq_lens, 3, 20, 0, 0)


def test_a_plan_lives_with_its_cache():
    import gc

    model = random_model(tiny_config(), weights="fp32", seed=7)
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    run(model, model.ops, prompt[:, :1], prompt)
    gc.collect()
    plans = model.ops.blocks.__self__.plans  # the CPU OpSet's plan cache: cache -> (model, version, plan)
    assert len(plans) == 0  # run()'s cache is gone, and its plan with it
    eng = Engine(model, max_seq_len=32)
    eng.generate(prompt[0].tolist(), 3)
    assert list(plans) == [eng.cache]
    version = model.version
    model.ensure_rope(4096)  # a new version: the next forward plans again
    assert model.version != version
    eng.generate(prompt[0].tolist(), 3)
    assert plans[eng.cache][1] == model.version
