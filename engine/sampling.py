"""Sampling: temperature, top-k, top-p and a seeded generator; greedy (argmax) at temperature 0.

`probs()` is the one place logits become a sampling distribution, so plain decoding and speculative
acceptance shape p_target and p_draft identically (the condition for speculative sampling to be exact).
`draw()` is the one way a token is drawn from a distribution, in plain and speculative decoding alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    seed: int | None = 0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]; use 1 to switch nucleus sampling off")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k={self.top_k} must be an integer >= 0; use 0 to switch top-k off")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device) -> torch.Generator:
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


def mask_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [R, V] -> the same with tokens outside top-k / the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose mass reaches top_p (always >= 1 token)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        p = sorted_logits.softmax(-1)
        drop = (p.cumsum(-1) - p) >= top_p  # mass before this token already reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 logits [R, V] -> sampling distribution [R, V]; one-hot argmax when greedy."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return mask_logits(logits.float() / params.temperature, params.top_k, params.top_p).softmax(-1)


def shown_probs(logits: torch.Tensor, dist: torch.Tensor | None, params: SamplingParams) -> torch.Tensor:
    """The probabilities a token is reported with: the sampling distribution `dist`, except when greedy,
    where that is one-hot and says nothing, so the model's own softmax is shown instead."""
    return logits.float().softmax(-1) if params.greedy else dist


def draw(weights: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Sample from unnormalized weights [R, V] -> [R] long, without a host sync.

    argmax(w / E) with E ~ Exp(1) picks index i with probability w_i / sum(w) (the exponential race), so
    the row never needs normalizing, and unlike torch.multinomial it never synchronizes on CUDA (gpt-fast
    samples this way for the same reason). E is clamped away from 0, where a zero weight would give
    0/0 = NaN and win the argmax."""
    e = torch.empty_like(weights, dtype=torch.float32).exponential_(generator=gen)
    return (weights / e.clamp_min_(torch.finfo(torch.float32).tiny)).argmax(-1)


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None,
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [R, V] -> (token ids [R] long, the distribution [R, V] they were drawn from), on the device.
    Greedy takes the argmax and leaves the one-hot distribution unbuilt (None)."""
    if params.greedy:
        return logits.argmax(-1), None
    dist = probs(logits, params)
    return draw(dist, gen), dist
