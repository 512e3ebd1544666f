"""Hand-made Round / Stats for the UI's tests: every kind, plausible timings, no engine needed."""
from __future__ import annotations

import random

from engine.request import unknown
from engine.stats import Round, Stats, Token


def synthetic_rounds(n_rounds: int = 12, k: int = 0, seed: int = 0, vocab: int = 100) -> list[Round]:
    """Round 0 is the prefill; with k > 0 each later round drafts k tokens and accepts a random prefix."""
    rng = random.Random(seed)
    t = 0.0
    rounds = []
    for i in range(n_rounds):
        start = t
        if i == 0:
            target, draft, sample = 20.0 + rng.random(), 0.0, 0.3
            tokens = [Token(rng.randrange(vocab), "target", p_target=rng.random())]
        elif k == 0:
            target, draft, sample = 8.0 + rng.random(), 0.0, 0.2
            tokens = [Token(rng.randrange(vocab), "target", p_target=rng.random())]
        else:
            n_acc = rng.randint(0, k)
            tokens = [Token(rng.randrange(vocab), "accepted", j, rng.random(), 1.0) for j in range(n_acc)]
            if n_acc < k:
                tokens.append(Token(rng.randrange(vocab), "rejected", n_acc, rng.random(), 1.0))
                tokens.append(Token(rng.randrange(vocab), "resampled", None, rng.random()))
            else:
                tokens.append(Token(rng.randrange(vocab), "bonus", None, rng.random()))
            draft, target, sample = 1.0 + rng.random(), 10.0 + rng.random(), 0.5
        t += draft + target + sample + 0.1 + 0.2 * rng.random()
        rounds.append(Round(i, tokens, start, t, draft, target, sample, k if i else 0, i == n_rounds - 1,
                            k=(k if i else None) if k else None))
    return rounds


def synthetic_stats(n_rounds: int = 12, k: int = 0, seed: int = 0, **settings) -> Stats:
    mode = settings.pop("mode", "n-gram" if k else "plain")
    return Stats(
        synthetic_rounds(n_rounds, k, seed), prompt_len=7, settings=dict(mode=mode, k=k, **settings),
        peak_memory_mb=321.0, weight_bytes=270_000_000, bandwidth_gbs=20.0,
    )


def text_of(token_id: int) -> str:
    return f"<t{token_id}>" if token_id % 7 == 0 else f" w{token_id}"


# Where the tiny runtime's settings differ from the request record's defaults (engine.request): no graphs or
# kernels to build, no chat template, the tiny draft model, short runs.
TINY_CHANGES = dict(k=4, layers=2, draft_model="tiny-draft", cuda_graphs=False, fused_kernels=False, chat=False,
                    max_new_tokens=16)


def tiny_settings(**overrides) -> dict:
    """The settings a test sends by name, as an API client does (a setting not named keeps the record's default):
    TINY_CHANGES with overrides, whose names must be the record's."""
    unknown(overrides)
    return {**TINY_CHANGES, **overrides}
