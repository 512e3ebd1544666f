"""What the latency, speculative and profile benchmarks share: the model shapes they time on random weights,
and the timing of one decode step and of one verify pass of T tokens on an engine.

Each timed call ends with the read-back a real decode loop needs anyway (to sample, stream or stop), so a
step's time is what a user waits for, device work included.
"""
from __future__ import annotations

import statistics
import time

import torch

from engine import Engine
from engine.config import ModelConfig

SHAPES = {
    # TinyLlama-1.1B: the GPU benchmarks' model (22 layers, GQA 32/4, head_dim 64)
    "tinyllama": dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5,
                      max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False),
    # SmolLM2-135M, the embedded default model's shape (30 layers, GQA 9/3, tied 49152-token head)
    "default": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5,
                    max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True),
}


def shape_config(name: str) -> ModelConfig:
    return ModelConfig.from_dict(SHAPES[name])


def prompt_ids(vocab: int, n: int, seed: int = 0) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def sync(t: torch.Tensor) -> None:
    t.reshape(-1)[:1].tolist()


@torch.inference_mode()
def step_ms(eng: Engine, prompt: list[int], steps: int, batch: int = 1, warmup: int = 4) -> list[float]:
    """ms of each of `steps` greedy decode steps on `batch` identical rows after the prompt's prefill."""
    tokens = torch.tensor([prompt] * batch, device=eng.device)
    eng.cache.set_length(len(prompt))
    tok = eng.model(tokens, eng.cache, "prefill", last_only=True).argmax(-1)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        tok = eng.decode(tok).argmax(-1)
        sync(tok)
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    return times


@torch.inference_mode()
def verify_ms(eng: Engine, prompt: list[int], T: int, repeats: int = 12) -> float:
    """Median ms of a verify pass of T tokens (eng.chunk) on top of the prompt, rolled back after each."""
    eng.prefill(prompt)
    tokens = torch.tensor([prompt[:T]], device=eng.device)
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        sync(eng.chunk(tokens).argmax(-1))
        if i >= 2:  # the first calls at a new shape pick kernels (and capture a graph)
            times.append((time.perf_counter() - t) * 1e3)
        eng.rollback(len(prompt))
    return statistics.median(times)


def verify_costs(eng: Engine, prompt: list[int], ts=(1, 2, 4, 6, 9), steps: int = 32, rounds: int = 3) -> dict:
    """A decode step's median ms, and each verify pass's ms over it (T = 1 is the step through chunk()).

    Steps and passes alternate over `rounds` rounds, and each ratio is the median of the rounds' own ratios:
    on a shared machine whose memory bandwidth moves within minutes, a step and a pass timed apart could
    land in different regimes."""
    step_all, ms_all, ratios = [], {T: [] for T in ts}, {T: [] for T in ts}
    for _ in range(rounds):
        step = statistics.median(step_ms(eng, prompt, steps))
        step_all.append(step)
        for T in ts:
            ms = verify_ms(eng, prompt, T)
            ms_all[T].append(ms)
            ratios[T].append(ms / step)
    out = dict(step_ms=statistics.median(step_all))
    for T in ts:
        out[f"verify{T}_ms"], out[f"verify{T}_over_step"] = statistics.median(ms_all[T]), statistics.median(ratios[T])
    return out
