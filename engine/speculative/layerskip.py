"""Self-speculation by layer skipping: the target with some of its layers left out drafts for itself.

The drafter runs a Transformer whose modules *are* the target's (no weight copy), on its own Engine over the
target's own KV cache: its layer j reads and writes the target's layer keep[j] (KVCache.layers), as SWIFT
(Xia et al. 2024) and Draft & Verify (Zhang et al. 2023) draft. So it has no cache or prefill of its own and
nothing to catch up after plain rounds: a proposal starts at the target's length, and its drafts' entries lie
past it, where the verify pass writes the target's own. Which layers it runs is either given (the first N, the
old truncation, or any set) or calibrated on each prompt before the target's prefill:

  1. one forward of the target over the prompt's last CONTEXT tokens records, at the last WINDOW positions,
     how much each layer turns the residual stream (1 - cos(h_in, h_out), ShortGPT's block influence) and the
     target's next-token distributions;
  2. for a few skip counts, the layers that turn the stream least are left out and the view's distributions at
     the same positions, over the target's K/V of the positions before them, are compared with the target's:
     sum_x min(p_t(x), p_d(x)) is the probability that speculative sampling accepts a draft there (at
     temperature 0: the argmaxes agree), under the run's sampling;
  3. the count with the most modeled tokens per second wins (schedule.py's formula, a draft step costing
     its share of the layers plus the head, and the engine's verify cost per position).

A prompt of at most CONTEXT tokens is the calibration's whole forward, which is then the target's prefill: its K/V
is copied into the target's cache and the head runs on its last position as Engine.prefill's would (the same
kernels on the same rows: the same bits), so the run's first token costs one prefill, not two (prefilled()).

A drafted token costs its draft step (c of a plain step) and its position in the verify pass (s); where c + s >= 1
even a draft that is always accepted costs more than the plain step that would have made its token, so no k
can pay ((k + 1) / (1 + k (c + s)) <= 1). The calibrated drafter then sits the run out under the adaptive
schedule (sits_out says why): every round is a plain step and nothing is probed. On a small model whose head is
a large share of a step (the default model's is 31% of its bytes) the layers that can be skipped without losing
acceptance leave c near 0.9, and that is the usual verdict there.

SWIFT and Draft & Verify search skip sets by Bayesian optimization against the same agreement; a ranking and a
handful of candidates fit a CPU's budget. The schedule then measures what the chosen set really costs and
accepts, and drafts only where that pays.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from engine.speculative import estimates, schedule
from engine.speculative.drafters import ModelDrafter
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams, greedy_rows, probs

CONTEXT = 64  # prompt tokens the calibration runs over (its last ones)
WINDOW = 16  # positions whose next-token distributions are compared
SKIP_FRACTIONS = (1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2)  # of the layers, the candidate skip counts
ENGINES_KEPT = 2  # view engines kept for reuse (a prompt often calibrates to the last set; a graph each)


def truncated(model: nn.Module, n_layers: int) -> nn.Module:
    """The first n_layers of model, its final norm and head (a view of a prefix)."""
    return model.view(range(n_layers))


@dataclasses.dataclass
class Calibration:
    keep: list[int]  # the layers the drafter runs
    acceptance: float  # expected acceptance per draft at the calibration positions
    influence: list[float]  # per target layer: 1 - cos(h_in, h_out) at those positions
    candidates: dict[int, float]  # layers skipped -> expected acceptance
    draft_cost: float  # the kept set's modeled draft step over a plain step (its layers' share plus the head)
    prompt_logits: torch.Tensor | None = None  # [V] at the prompt's last position, where it filled a target cache


def _prefill(model, ids: list[int], window: int) -> tuple[torch.Tensor, KVCache]:
    """The logits [W, V] of the last `window` positions of a fresh forward over ids, and the cache it filled (its
    own, throwaway)."""
    cache = KVCache(model.config, 1, len(ids), model.kv_dtype or model.dtype, model.device)
    cache.set_length(len(ids))
    return model(torch.tensor([ids], device=model.device), cache, "prefill", tail=window)[0], cache


def drafted(model, keep: list[int], ids: list[int], window: int, cache: KVCache) -> torch.Tensor:
    """The view over `keep`: its logits [W, V] at the last `window` positions of ids, over the target's K/V of
    the positions before them in `cache` (as the drafter runs); it writes only its layers' window positions."""
    view = model.view(keep)
    shared = cache.layers(keep, view.config)
    shared.set_length(len(ids))
    tokens = torch.tensor([ids[-window:]], device=model.device)
    return view(tokens, shared, "cached", start=len(ids) - window)[0]


def influence(model, ids: list[int], window: int, last: dict | None = None
              ) -> tuple[list[float], torch.Tensor, KVCache]:
    """(1 - cos(h_in, h_out) per layer at the last `window` positions, the target's logits there [W, V], the
    target's cache over ids). last: given, its "x" is the head's input at the last position [1, C]."""
    saved, scores = {}, []

    def before(block, args):  # Block.forward(x, h, next_norm, s): h is the residual stream, updated in place
        saved["h"] = args[1][-window:].float().clone()

    def after(block, args, out):  # out: the next norm of the stream, the last block's the head's input
        scores.append(1 - torch.cosine_similarity(saved["h"], args[1][-window:].float(), dim=-1).mean().item())
        if last is not None and block is model.layers[-1]:
            last["x"] = out[-1:].clone()

    hooks = [h for b in model.layers for h in (b.register_forward_pre_hook(before), b.register_forward_hook(after))]
    try:
        with model.blocks_in_python():
            logits, cache = _prefill(model, ids, window)
    finally:
        for h in hooks:
            h.remove()
    assert len(scores) == model.config.n_layers
    return scores, logits, cache


def judged(model, logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """What a candidate is judged by at the window's positions, from logits [W, V] the model's head has just made:
    at temperature 0 each row's argmax [W], the head pass's own picks (sampling.HeadPicks); else the sampling
    distributions [W, V]. A one-hot [W, V] per candidate and the target, and their minimum, took ~10 of a
    calibration's ~90 ms on the default model's 49,152-token rows."""
    if sampling.greedy:
        return torch.tensor([pick[0] for pick in greedy_rows(logits, model.head_picks, model.ops.greedy)])
    return probs(logits, sampling, model.ops.softmax)


def agreement(target: torch.Tensor, draft: torch.Tensor) -> float:
    """The probability that speculative sampling accepts a draft, averaged over the window: sum_x min(p_t, p_d) of
    two judged() distributions, or at temperature 0 the share of argmaxes that agree (the same float32 mean)."""
    if target.dim() == 1:
        return (target == draft).float().mean().item()
    return torch.minimum(target, draft).sum(-1).mean().item()


def step_share(model) -> float:
    """The share of a decode step that does not scale with the layers: the head's bytes over all bytes read."""
    return model.lm_head.weight.nbytes / model.weight_bytes


def modeled_speedup(acceptance: float, draft_cost: float, k_max: int,
                    slope: float = estimates.PRIOR_VERIFY_SLOPE) -> float:
    """Tokens per plain-step time of the best k, with constant acceptance and a verify pass costing
    1 + slope (T - 1) steps."""
    e = estimates.expected_tokens([acceptance] * k_max)
    return max(e[k] / (k * draft_cost + 1 + slope * k) for k in range(k_max + 1))


def verify_slope(engine) -> float:
    """A verify position's cost over a plain step's on this engine: its recent speculative runs' measurement,
    else the schedule's prior (schedule.recalled_slope)."""
    return schedule.recalled_slope(engine)


@torch.inference_mode()
def calibrate(model, prompt_ids: list[int], sampling: SamplingParams, k_max: int = 5,
              slope: float = estimates.PRIOR_VERIFY_SLOPE, fill: KVCache | None = None) -> Calibration:
    """fill: a cache of the model's (the target's) to leave holding the prompt, as Engine.prefill would, when the
    prompt is no longer than CONTEXT; the result's prompt_logits are then the prefill's logits."""
    ids = list(prompt_ids[-CONTEXT:])
    window = min(WINDOW, len(ids))
    model.ensure_rope(len(ids))
    L = model.config.n_layers
    fills = fill is not None and len(ids) == len(prompt_ids)
    last = {} if fills else None
    scores, logits, cache = influence(model, ids, window, last)
    if fills:
        fill.copy_prefix(cache, len(ids))  # before the candidates write their window positions into `cache`
    target = judged(model, logits, sampling)
    order = sorted(range(L), key=scores.__getitem__)  # least influence first
    counts = sorted({min(L - 1, max(1, round(f * L))) for f in SKIP_FRACTIONS})
    head, best, candidates = step_share(model), None, {}
    for n_skip in counts:  # fewest skipped first; acceptance falls faster than cost, so stop once it stops paying
        keep = sorted(order[n_skip:])
        acc = agreement(target, judged(model, drafted(model, keep, ids, window, cache), sampling))
        candidates[n_skip] = acc
        cost = head + (1 - head) * len(keep) / L
        # ties (no candidate beats a plain step in the model) go to the most tokens per draft cost
        score = (modeled_speedup(acc, cost, k_max, slope), acc / cost)
        if best is not None and score <= best[0]:
            break
        best = (score, keep, acc, cost)
    # the head last, after the candidates' own: its greedy picks (model.head_picks) are then the prompt's
    prompt_logits = model.head(last["x"]).view(-1) if fills else None
    return Calibration(best[1], best[2], scores, candidates, best[3], prompt_logits)


class LayerSkipDrafter(ModelDrafter):
    """Self-speculation over a subset of the target's layers, then its final norm and LM head.

    layers: the layers to run (any subset); n_layers: the first n_layers (truncation); neither: calibrated on
    each prompt (see the module docstring), inside round 0 so the first token's time includes it."""

    name = "layer_skip"
    shares_prefill = True  # a short prompt's calibration makes the target's prefill too (bench/first_token.py: off)

    def __init__(self, engine, n_layers: int | None = None, layers: Sequence[int] | None = None):
        total = engine.config.n_layers
        if n_layers is not None and layers is not None:
            raise ValueError("give n_layers (the first N) or layers (a set), not both")
        if n_layers is not None:
            if not (isinstance(n_layers, int) and 1 <= n_layers < total):
                raise ValueError(f"n_layers={n_layers} must be in 1..{total - 1} (the target has {total} layers)")
            layers = range(n_layers)
        if layers is not None:
            layers = sorted(set(layers))
            if not (1 <= len(layers) < total and all(isinstance(i, int) and 0 <= i < total for i in layers)):
                raise ValueError(f"layers={layers} must be 1..{total - 1} distinct indices in 0..{total - 1}")
        super().__init__(None)
        self.target, self.fixed = engine, layers  # target: always on its cache (ModelDrafter's prepare, commit)
        self.keep: list[int] = layers or []
        self.calibration: Calibration | None = None
        self.filled = False  # whether the last calibration also made the target's prefill (a short prompt)
        self.slope = estimates.PRIOR_VERIFY_SLOPE  # the verify cost per position the last calibration used
        self.engines: dict[tuple[int, ...], object] = {}
        self.engine = self._engine(layers) if layers else None

    def _engine(self, keep):
        from engine.engine import Engine

        key = tuple(keep)
        if key not in self.engines:
            while len(self.engines) >= ENGINES_KEPT:
                self.engines.pop(next(iter(self.engines)))
            view = self.target.model.view(keep)
            self.engines[key] = Engine(view, self.target.max_seq_len, cache=self.target.cache.layers(keep, view.config))
        return self.engines[key]

    def on_cache_of(self, target) -> bool:
        """Always: the views run on the cache of the engine this drafter was built on, which must be the target."""
        if target is not self.target:
            raise ValueError("this LayerSkipDrafter was built on another engine; build one on the target")
        return True

    def begin(self, target, prompt_ids, sampling, extra) -> None:
        self.on_cache_of(target)
        self.sits_out, self.filled = None, False
        if self.fixed is None:
            self.slope = verify_slope(target)
            fill = target.cache if self.shares_prefill else None
            self.calibration = c = calibrate(target.model, prompt_ids, sampling, slope=self.slope, fill=fill)
            self.keep, self.filled = c.keep, c.prompt_logits is not None
            if c.draft_cost + self.slope >= 1:
                self.sits_out = (f"a draft of {len(c.keep)} of {target.config.n_layers} layers costs about "
                                 f"{c.draft_cost:.2f} of a step (the head alone {step_share(target.model):.0%} of "
                                 f"its bytes) and each verified position {self.slope:.2f} more, so even a draft that "
                                 "is always accepted costs more than the plain step that would make its token")
        self.engine = self._engine(self.keep)
        # follow the target's kernel and graph choices; graphs captured with other kernels are re-captured
        # use_ops bumps the view's version, so only a real change may call it: a graph is captured once per set
        changed = self.engine.model.ops is not target.model.ops
        if changed:
            self.engine.model.use_ops(target.model.ops)
        if target.graph is not None and (changed or self.engine.graph is None):
            self.engine.use_graphs(True)
        elif target.graph is None and self.engine.graph is not None:
            self.engine.use_graphs(False)
        self.start(target, len(prompt_ids))  # no prefill: the target's own fills the cache the view reads

    def prefilled(self) -> torch.Tensor | None:
        """The target's prefill logits where the calibration filled its cache with the prompt (a prompt of at
        most CONTEXT tokens), once; else None."""
        c = self.calibration
        if c is None or c.prompt_logits is None:
            return None
        logits, c.prompt_logits = c.prompt_logits, None
        return logits

    def describe(self) -> dict:
        total = self.target.config.n_layers
        out = {"drafter": self.name, "draft_layers": len(self.keep), "target_layers": total,
               "layer_set": "calibrated" if self.fixed is None else "given",
               "skipped_layers": " ".join(str(i) for i in range(total) if i not in self.keep) if self.keep else None}
        if self.calibration is not None:
            out["calibrated_acceptance"] = round(self.calibration.acceptance, 3)
            out["modeled_draft_cost"] = round(self.calibration.draft_cost, 3)
            out["verify_slope"] = round(self.slope, 3)
            out["calibration_prefilled"] = self.filled
        if self.sits_out:
            out["sits_out"] = self.sits_out
        return out
