"""Long context: window + sink attention against full attention, speed and quality side by side.

For each weight format and context length (a prefix of bench/data/long.txt, the project's own docs and
sources), one prefill fills the cache (the prompt is always attended in full), then the same engine decodes
with full attention and with a window of W positions plus S sinks:
  speed    ms per decode step and tok/s; the attention kernel's own ms per step, timed alone over the
           engine's real cache at that length, and its share of the step; the window's speedup;
  quality  on the next 128 tokens of the text: perplexity and top-1 agreement with full attention
           (teacher-forced through verify passes of 16 tokens), and the first position where free greedy
           decoding leaves full attention's tokens.

    python -m bench.long [--contexts 1024 4096 8064] [--window 512] [--sinks 4] [--weights fp32 q4]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import markdown_table, run_and_save
from engine import Engine, Tokenizer, load_model
from engine.observe.bandwidth import measure_gbs
import torch

TEXT = Path(__file__).parent / "data" / "long.txt"
CONTINUATION = 128
VERIFY = 16  # tokens per teacher-forced verify pass


def sync(t: torch.Tensor) -> int:
    return int(t.reshape(-1)[0])


@torch.inference_mode()
def decode_ms(eng: Engine, length: int, token: int, steps: int) -> list[float]:
    """ms of each greedy step from the cache's first `length` positions; rolled back afterwards."""
    times, tok = [], torch.tensor([token])
    for _ in range(steps):
        t = time.perf_counter()
        tok = eng.decode(tok).argmax(-1)
        sync(tok)
        times.append((time.perf_counter() - t) * 1e3)
    eng.rollback(length)
    return times


@torch.inference_mode()
def attention_ms(eng: Engine, repeats: int = 5) -> float:
    """The attention op alone over every layer's real cache at the current length: one decode step's worth."""
    cfg, cache = eng.config, eng.cache
    q = torch.randn(1, 1, cfg.n_heads, cfg.head_dim, dtype=eng.model.dtype)
    kv_limit = eng._kv_limit(cache.length)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        for layer in range(cfg.n_layers):
            eng.model.ops.attention(q, cache.layer_k[layer][:, :, :kv_limit], cache.layer_v[layer][:, :, :kv_limit],
                                    cache.seq_lens, cfg.head_dim ** -0.5, eng.window or 0, eng.sinks)
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best


@torch.inference_mode()
def teacher_forced(eng: Engine, length: int, first_logits: torch.Tensor, continuation: list[int]) -> torch.Tensor:
    """Logits [len(continuation), V] predicting each continuation token: the prompt's last logits predict the
    first; verify passes over the continuation predict the rest (row j of a pass: the token after its j-th)."""
    rows = [first_logits[None]]
    for i in range(0, len(continuation) - 1, VERIFY):
        rows.append(eng.chunk(torch.tensor([continuation[i:i + VERIFY]]))[0])
    eng.rollback(length)
    return torch.cat(rows)[: len(continuation)]


@torch.inference_mode()
def greedy(eng: Engine, length: int, first: int, n: int) -> list[int]:
    ids, tok = [first], torch.tensor([first])
    for _ in range(n - 1):
        tok = eng.decode(tok).argmax(-1)
        ids.append(sync(tok))
    eng.rollback(length)
    return ids


def bench(args, save) -> dict:
    tok = Tokenizer(load_model(None, weights="fp32", progress=lambda msg: None).path)
    ids = tok.encode(TEXT.read_text())
    bw = measure_gbs("cpu")
    out = dict(model="SmolLM2-135M-Instruct (embedded default)", text=TEXT.name, text_tokens=len(ids),
               window=args.window, sinks=args.sinks, steps=args.steps, bandwidth_gbs=bw, rows=[])
    for fmt in args.weights:
        model = load_model(None, weights=fmt, progress=lambda msg: None)
        for context in args.contexts:
            if context + CONTINUATION > min(len(ids), model.config.max_position_embeddings):
                raise SystemExit(f"context {context} + {CONTINUATION} passes the text ({len(ids)} tokens) or the "
                                 f"model's {model.config.max_position_embeddings} positions")
            prompt, continuation = ids[:context], ids[context:context + CONTINUATION]
            eng = Engine(model, max_seq_len=context + CONTINUATION + VERIFY)
            eng.bandwidth_gbs = bw
            first_logits = eng.prefill(prompt)
            first = sync(first_logits.argmax(-1))
            target = torch.tensor(continuation)
            base = None
            for window in (None, args.window):
                eng.use_window(window, args.sinks)
                steps = decode_ms(eng, context, first, args.steps)
                ms = statistics.median(steps)
                attn = attention_ms(eng)
                logits = teacher_forced(eng, context, first_logits, continuation)
                text = greedy(eng, context, first, CONTINUATION)
                row = dict(weights=fmt, context=context, attention=eng.attention_mode, ms_per_step=ms, tok_s=1e3 / ms,
                           attention_ms=attn, attention_pct=100 * attn / ms,
                           kv_mb_read=eng.cache.bytes_per_token * min(context, window + args.sinks if window else
                                                                      context) / 1e6,
                           perplexity=math.exp(torch.nn.functional.cross_entropy(logits, target).item()),
                           kernels=eng.kernel_status)
                if base is None:
                    base = dict(ms=ms, logits=logits, text=text)
                    row.update(speedup=1.0, top1_agreement=1.0, greedy_parts_at=None)
                else:
                    same = (logits.argmax(-1) == base["logits"].argmax(-1)).float().mean().item()
                    parts = next((i for i, (a, b) in enumerate(zip(text, base["text"], strict=True)) if a != b), None)
                    row.update(speedup=base["ms"] / ms, top1_agreement=same, greedy_parts_at=parts)
                out["rows"].append(row)
                print({k: v for k, v in row.items() if k != "kernels"}, flush=True)
                save(out)
    return out


def markdown(result: dict) -> str:
    head = (f"Long context on CPU: {result['model']}, prompts from {result['text']} ({result['text_tokens']} tokens); "
            f"full attention against a window of {result['window']} plus {result['sinks']} sinks, the same engine "
            f"and prefill. ms per step: median of {result['steps']} greedy steps; attention ms: the attention op "
            "alone over the real cache, every layer, best of 5; quality on the next 128 tokens of the text "
            "(perplexity, top-1 agreement with full attention teacher-forced, first position where greedy decoding "
            f"parts from full attention's, blank when it never does). Read bandwidth {result['bandwidth_gbs']:.1f} "
            "GB/s in the same run.\n\n")
    cols = ["weights", "context", "attention", "tok_s", "ms_per_step", "speedup", "attention_ms", "attention_pct",
            "kv_mb_read", "perplexity", "top1_agreement", "greedy_parts_at"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8064])
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--weights", nargs="+", default=["fp32", "q4"])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    run_and_save(args.out, "long-cpu", "cpu", lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
