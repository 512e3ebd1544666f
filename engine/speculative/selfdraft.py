"""Self-drafting: the target's own weights, made cheaper, draft for it. Two ways to make them cheaper:

  a copy in a format of fewer bits (ModelDrafter over a second load of the target's checkpoint), or
  the target's own blocks with some layers left out (LayerSkipDrafter: no copy, calibrated per prompt).

A copy only pays where its decode step is much cheaper than the target's. Decode reads every weight byte once,
so a copy of a Q4_K_M file (4.5-6.6 bits a weight, ~4.9 on average) in q4 (5 bits, Q4_1) or q4_k (4.5) reads
about the target's bytes and costs about its step; a copy of an int8 or fp32 target in 4-5 bits costs a half
or less. `self_drafter(target)` measures: it loads a copy only in a format whose bits promise a step of at
most COPY_MAX_COST of the target's (copy_format), times both steps, and keeps the copy if the measured ratio
holds; otherwise the target's own blocks draft with layers skipped.
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.sampling import SamplingParams
from engine.speculative.drafters import ModelDrafter
from engine.speculative.layerskip import LayerSkipDrafter

GREEDY = SamplingParams()  # step_ms's picks
# A copy drafting at more than this share of a target step leaves little to win: with acceptance a ~0.8 and
# k ~4 the modeled speedup (estimates.expected_tokens over k * cost + verify) falls under ~1.3x past it, where
# layer skipping's calibrated half of the layers, with no second copy in memory, does as well.
COPY_MAX_COST = 0.7
# the copy's format, first that qualifies: q4 first (the default model's own blocks, so a lossless copy there),
# then the K-quants (their per-sub-block scales round a target's weights least for their bits)
PREFERENCE = ("q4", "q4_k", "q4_0", "q5_k", "q5_0", "q6_k", "int8")


def bits_per_weight(model) -> float:
    """The bits a decode step reads per weight (norms and head included)."""
    return 8 * model.weight_bytes / sum(m.in_features * m.out_features for m in model.linears())


def copy_format(target) -> str | None:
    """The format this path runs a copy of the target's weights in (PREFERENCE's first) among those whose bits
    are at most COPY_MAX_COST of what the target reads a weight; None where no format is that much cheaper."""
    from engine import weights as wts
    from engine.checkpoint.formats import runs

    here = [f for f in wts.FORMATS if f in wts.QUANTIZED and runs(f, target.model.ops)]
    cheap = [f for f in here if wts.get(f).bits <= COPY_MAX_COST * bits_per_weight(target.model)]
    if not cheap:
        return None
    return next((f for f in PREFERENCE if f in cheap), None)


@torch.inference_mode()
def step_ms(engine, steps: int = 4) -> float:
    """Median ms of a few greedy decode steps on a short throwaway sequence (the cache is rolled back), each with
    its pick as plain decoding makes it (Engine.pick: on the CPU the head pass's own)."""
    engine.prefill([0] * 8)
    tok = torch.zeros(1, dtype=torch.long, device=engine.device)
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        engine.pick(engine.decode(tok)[0], GREEDY, None)
        times.append((time.perf_counter() - t) * 1e3)
    engine.rollback(0)
    return statistics.median(times[1:])  # the first step at a shape picks its kernels


def copy_cost(target, draft, rounds: int = 3) -> float:
    """The draft's decode step over the target's, alternating, median of the rounds' own ratios."""
    return statistics.median(step_ms(draft) / step_ms(target) for _ in range(rounds))


def load_copy(target, weights: str):
    """An Engine over the target's checkpoint loaded again with its projections in `weights`, on the target's KV
    cache (ModelDrafter: the same checkpoint drafts over it; no second cache)."""
    from engine.checkpoint import load_model
    from engine.engine import Engine

    m = target.model
    if m.path is None:
        raise ValueError("self-drafting loads the target's checkpoint again; this target has no folder")
    if weights == m.weight_format:
        raise ValueError(f"the target already runs {weights} weights; self-drafting needs a cheaper format")
    draft = load_model(m.path, device=target.device, dtype=m.dtype, weights=weights, fused=m.ops.name == "fused",
                       progress=lambda msg: None)
    return Engine(draft, target.max_seq_len, cache=target.cache.layers(range(m.config.n_layers), draft.config))


def self_drafter(target, weights: str | None = None, measure=copy_cost):
    """The target's own weights drafting for it. weights: a format for the copy (a ModelDrafter over it, as
    asked); None: the cheapest by measurement (the module docstring): a copy in copy_format(target) if
    measure(target, copy) <= COPY_MAX_COST, else a LayerSkipDrafter over the target's blocks."""
    if weights is not None:
        return ModelDrafter(load_copy(target, weights))
    fmt = copy_format(target)
    if fmt is not None:
        draft = load_copy(target, fmt)
        cost = measure(target, draft)
        if cost <= COPY_MAX_COST:
            drafter = ModelDrafter(draft)
            drafter.chosen = f"a {fmt} copy: its step {cost:.2f} of the target's"
            return drafter
        why = f"a {fmt} copy measured {cost:.2f} of the target's step"
    else:
        why = f"no format this path runs is at most {COPY_MAX_COST} of the target's bits a weight"
    drafter = LayerSkipDrafter(target)
    drafter.chosen = f"the target's blocks with layers skipped ({why})"
    return drafter
