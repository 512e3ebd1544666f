"""Random models whose merged projections are stacked (engine/weights Stacked), as a GGUF file's mix loads them: q
and k in one format and v in another, gate in one and up in another. Used by tests/test_blocks_cpu.py and
tests/test_batch_invariance.py."""
from __future__ import annotations

import torch

from engine import weights
from engine.checkpoint import random_model
from engine.tiny import tiny_config

# (q and k, v) and (gate, up) in these formats: a Q4_K_M file's, Gemma 3's Q5_0 beside Q8_0, Q4_1 beside Q4_0, and a
# dense part beside blocks (a small tensor a file keeps in F32)
PAIRS = [("q4_k", "q6_k"), ("q5_0", "int8"), ("q4", "q4_0"), ("fp32", "q5_k")]
# intermediate 40: gate's 40 rows end inside a panel of 16, so up's segment starts there
SHAPE = dict(intermediate_size=40)


def restack(model, first: str, second: str):
    """`model` with every qkv weight as [q | k] in `first` and v in `second`, every gate_up as gate in `first` and up
    in `second`, each part re-quantized from the weight's values; returns it on its OpSet."""
    cfg = model.config
    for block in model.layers:
        for linear, rows in ((block.attn.wqkv, (cfg.q_size + cfg.kv_size, cfg.kv_size)),
                             (block.mlp.w_gate_up, (cfg.intermediate_size, cfg.intermediate_size))):
            w = linear.weight
            parts = weights.dequantize(weights.unpack(w)).split(rows)
            linear.weight = weights.stack([weights.pack(weights.quantize(p, fmt), w.layout)
                                           for p, fmt in zip(parts, (first, second), strict=True)])
    model.use_ops(model.ops)
    return model


def stacked_model(first: str, second: str, seed: int = 7, **shape):
    return restack(random_model(tiny_config(**SHAPE | shape), weights="fp32", seed=seed), first, second)


def dequantized(w: weights.Packed | weights.Stacked) -> torch.Tensor:
    """The fp32 weight [out, in] a (stacked) weight stands for."""
    return torch.cat([weights.dequantize(weights.unpack(s)) for s in w.segments])
