"""The KV cache in fp16 against fp32 on the CPU kernels, on the default model: the decode step at a few contexts, the
two caches taking turns context by context and round by round (one model, an engine on each cache), and what the
fp16 values cost in quality: each cache's next-token distributions against the exact model's (its Q4_1 file's
values in fp32, with an fp32 cache), teacher-forced over two texts in 16-token passes that read the cache.

    python -m bench.kv_cache --name kv-cache-cpu-zen4
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import engine  # noqa: F401  (before torch: the OpenMP settings)
import torch

from bench.common import markdown_table, run_and_save
from engine import Engine, Tokenizer, load_model

REPO = Path(__file__).resolve().parent.parent
TEXTS = {"prose (README)": (REPO / "README.md", 20000), "code (engine/model.py)": (REPO / "engine/model.py", 0)}
CACHES = {"fp32": torch.float32, "fp16": torch.float16}
SPEED_COLS = ["context", "fp32_step_ms", "fp16_step_ms", "fp16_over_fp32", "lo", "hi", "kv_mb_fp32", "rounds"]
QUALITY_COLS = ["weights", "text", "cache", "kl_vs_exact", "top1_vs_exact", "top1_vs_fp32_cache", "positions"]


def step_times(model, contexts: list[int], rounds: int, steps: int) -> list[dict]:
    engines = {name: Engine(model, max_seq_len=max(contexts) + steps + 8, kv_dtype=dt) for name, dt in CACHES.items()}
    g = torch.Generator().manual_seed(0)
    ms = {(name, c): [] for name in CACHES for c in contexts}
    tok = torch.tensor([5])
    for rnd in range(rounds):
        for i, c in enumerate(contexts):
            ids = torch.randint(100, min(model.config.vocab_size, 49152), (c,), generator=g).tolist()
            for name in (list(CACHES) if (rnd + i) % 2 == 0 else list(CACHES)[::-1]):
                eng = engines[name]
                eng.prefill(ids)
                for _ in range(2):
                    eng.decode(tok)
                start = time.perf_counter()
                for _ in range(steps):
                    eng.decode(tok)
                ms[name, c].append((time.perf_counter() - start) / steps * 1e3)
    rows = []
    for c in contexts:
        ratios = [b / a for a, b in zip(ms["fp32", c], ms["fp16", c], strict=True)]
        rows.append(dict(context=c, fp32_step_ms=statistics.median(ms["fp32", c]),
                         fp16_step_ms=statistics.median(ms["fp16", c]), fp16_over_fp32=statistics.median(ratios),
                         lo=min(ratios), hi=max(ratios), kv_mb_fp32=engines["fp32"].cache.bytes_per_token * c / 1e6,
                         rounds=rounds))
    return rows


def teacher_forced(eng: Engine, ids: list[int]) -> torch.Tensor:
    """log-softmax [P, V] at every position after the first 32, in 16-token passes over the cache."""
    eng.prefill(ids[:32])
    return torch.cat([eng.chunk(torch.tensor([ids[i:i + 16]]))[0] for i in range(32, len(ids), 16)]).log_softmax(-1)


def quality(tokens: int, formats: list[str]) -> list[dict]:
    exact = load_model(None, device="cpu", weights="fp32", progress=lambda s: None)
    tok = Tokenizer(exact.path)
    rows = []
    for text, (path, offset) in TEXTS.items():
        ids = tok.encode(path.read_text()[offset:])[:tokens]
        ref = teacher_forced(Engine(exact, max_seq_len=tokens + 16), ids)
        for fmt in formats:
            model = load_model(None, device="cpu", weights=fmt, progress=lambda s: None)
            got = {name: teacher_forced(Engine(model, max_seq_len=tokens + 16, kv_dtype=dt), ids)
                   for name, dt in CACHES.items()}
            for name, lp in got.items():
                rows.append(dict(weights=fmt, text=text, cache=name, positions=lp.shape[0],
                                 kl_vs_exact=(ref.exp() * (ref - lp)).sum(-1).mean().item(),
                                 top1_vs_exact=(lp.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                                 top1_vs_fp32_cache=(lp.argmax(-1) == got["fp32"].argmax(-1)).float().mean().item()))
    return rows


def bench(args, save) -> dict:
    model = load_model(None, device="cpu", progress=lambda s: None)
    result = dict(model=f"SmolLM2-135M-Instruct (embedded default), {model.weight_format}", steps=args.steps,
                  kernels=Engine(model, 8).kernel_status)
    result["speed"] = step_times(model, args.contexts, args.rounds, args.steps)
    save(result)
    result["quality"] = quality(args.tokens, args.formats)
    return result


def markdown(result: dict) -> str:
    out = (f"The decode step on an fp16 KV cache against an fp32 one, {result['model']} ({result['kernels']}): "
           f"{result['steps']} greedy steps timed after each prefill of a random context, the caches taking turns; "
           "medians over rounds, fp16_over_fp32 the median of the rounds' own ratios (lo / hi their extremes), "
           "kv_mb_fp32 the fp32 cache's bytes at that context.\n\n" + markdown_table(result["speed"], SPEED_COLS))
    if "quality" in result:
        out += ("\n\nQuality, teacher-forced in 16-token passes over the cache: KL divergence and top-1 agreement "
                "of each cache's next-token distributions against the exact model's (the default model's Q4_1 "
                "values in fp32, fp32 cache), and top-1 against the same weights on the fp32 cache.\n\n"
                + markdown_table(result["quality"], QUALITY_COLS))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="the KV cache in fp16 against fp32: decode step and quality")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per prefill")
    p.add_argument("--tokens", type=int, default=1000, help="tokens of each text teacher-forced")
    p.add_argument("--formats", nargs="+", default=["q4_a8", "q4"], help="weight formats judged for quality")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="kv-cache-cpu", help="the results' file name (one per CPU kind)")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
