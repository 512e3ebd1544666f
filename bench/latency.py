"""Decode latency, measured as ratios within one run.

CPU:  our engine vs transformers' generate on the same weights and dtype (the embedded default model,
      batch 1, 128-token prompt, 128 new tokens), and % of the bandwidth ceiling.
CUDA: the matrix eager/graph x torch/fused at batch 1 and 8, on a TinyLlama-1.1B-shaped model with
      random bf16 weights and on the default model.

    python -m bench.latency --device cpu
    python -m bench.latency --device cuda --out bench/results
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import markdown_table, provenance, write_results
from bench.steps import prompt_ids, shape_config, step_ms, verify_costs
from engine import Engine, load_model
from engine.bandwidth import measure_gbs
from engine.loader import random_model
import torch

def transformers_decode(model_path, prompt, new_tokens, dtype) -> tuple[float, list[int]]:
    """transformers' greedy generate on the same weights: decode ms/token = (t(n) - t(1)) / (n - 1)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=dtype).eval()
    ids = torch.tensor([prompt])

    def run(n):
        t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return (time.perf_counter() - t) * 1e3, out[0, len(prompt):].tolist()

    run(4)  # warm-up
    t1 = min(run(1)[0] for _ in range(3))
    tn, out = run(new_tokens)
    return (tn - t1) / (new_tokens - 1), out


def ours_decode(eng: Engine, prompt, new_tokens) -> tuple[float, list[int], dict]:
    """Same wall-clock method as transformers_decode, plus our own per-step figures from the stream."""
    eng.generate(prompt, 4, stop_ids=[])  # warm-up

    def run(n):
        t = time.perf_counter()
        ids, stats = eng.generate(prompt, n, stop_ids=[])
        return (time.perf_counter() - t) * 1e3, ids, stats

    t1 = min(run(1)[0] for _ in range(3))
    tn, ids, stats = run(new_tokens)
    return (tn - t1) / (new_tokens - 1), ids, stats.summary()


def cpu_bench(args) -> dict:
    torch.manual_seed(0)
    model = load_model(None, device="cpu", dtype="float32")
    bw = measure_gbs("cpu")
    ceiling = bw * 1e9 / model.weight_bytes
    prompt = prompt_ids(model.config.vocab_size, args.prompt_len)
    eng = Engine(model, max_seq_len=args.prompt_len + args.new_tokens + 8)
    ours_ms, ours_ids, s = ours_decode(eng, prompt, args.new_tokens)
    hf_ms, hf_ids = transformers_decode(model.path, prompt, args.new_tokens, torch.float32)
    rows = [
        dict(engine="decodescope", ms_per_token=ours_ms, tok_s=1e3 / ours_ms, itl_p50_ms=s["itl_p50_ms"],
             itl_p99_ms=s["itl_p99_ms"], pct_of_ceiling=100 * 1e3 / ours_ms / ceiling),
        dict(engine="transformers", ms_per_token=hf_ms, tok_s=1e3 / hf_ms, itl_p50_ms=None, itl_p99_ms=None,
             pct_of_ceiling=100 * 1e3 / hf_ms / ceiling),
    ]
    return dict(
        model="SmolLM2-135M-Instruct (embedded default)", dtype="float32", batch=1, prompt_tokens=args.prompt_len,
        new_tokens=args.new_tokens, bandwidth_gbs=bw, weight_bytes=model.weight_bytes, ceiling_tok_s=ceiling,
        speedup_vs_transformers=hf_ms / ours_ms, same_greedy_tokens=ours_ids == hf_ids, rows=rows,
        kernels=eng.kernel_status,
    )


def cuda_bench(args, save) -> dict:
    """Formats x kernels x graphs x batch on random weights of each shape (a GPU machine has no network to
    fetch a model, and decode speed depends on the shape, format and kernels, not on the values). `save`
    writes the result after every row, so a timeout keeps what was measured."""
    bw = measure_gbs("cuda")
    out = dict(device="cuda", bandwidth_gbs=bw, rows=[],
               notes=["random weights of each shape, bf16 activations; q4 keeps the LM head in int8"])
    for shape in args.shapes:
        cfg = shape_config(shape)
        prompt = prompt_ids(cfg.vocab_size, args.prompt_len)
        for fmt in args.formats:
            for fused in (False, True):
                model = random_model(cfg, "cuda", torch.bfloat16, weights=fmt, fused=fused)
                for use_graph in (False, True):
                    for batch in args.batch:
                        out["rows"].append(cuda_case(model, shape, fmt, use_graph, batch, prompt, args, bw))
                        print(out["rows"][-1], flush=True)
                        save(out)
                del model
                torch.cuda.empty_cache()
    return out


def cuda_case(model, shape, fmt, use_graph, batch, prompt, args, bw) -> dict:
    eng = Engine(model, max_seq_len=args.prompt_len + args.new_tokens + 16, batch_size=batch)
    eng.use_graphs(use_graph)
    steps = step_ms(eng, prompt, args.new_tokens, batch)
    ms = statistics.median(steps)
    steps_per_s_ceiling = bw * 1e9 / model.weight_bytes  # batch rows share one read of the weights
    row = dict(shape=shape, weights=fmt, kernels=model.ops.name, graph=eng.graph is not None, batch=batch,
               ms_per_step=ms, tok_s=batch * 1e3 / ms, step_p99_ms=statistics.quantiles(steps, n=100)[98],
               pct_of_ceiling=100 * (1e3 / ms) / steps_per_s_ceiling,
               capture_ms=eng.graph.capture_ms.get("decode") if eng.graph else None,
               status=f"{eng.kernel_status} | {eng.graph_status}")
    if batch == 1:
        row.update({k: v for k, v in verify_costs(eng, prompt, ts=(6,)).items() if k.startswith("verify")})
    return row


def markdown(result: dict, device: str) -> str:
    if device == "cpu":
        head = (f"Decode on CPU, {result['model']}, {result['dtype']}, batch 1, {result['prompt_tokens']}-token "
                f"prompt, {result['new_tokens']} new tokens. Read bandwidth {result['bandwidth_gbs']:.1f} GB/s -> "
                f"ceiling {result['ceiling_tok_s']:.1f} tok/s. decodescope / transformers = "
                f"**{result['speedup_vs_transformers']:.2f}x**; "
                f"same greedy tokens: {result['same_greedy_tokens']}.\n\n")
        cols = ["engine", "tok_s", "ms_per_token", "itl_p50_ms", "itl_p99_ms", "pct_of_ceiling"]
    else:
        head = f"Decode on CUDA; copy bandwidth {result['bandwidth_gbs']:.0f} GB/s measured in the same run.\n\n"
        cols = ["shape", "weights", "kernels", "graph", "batch", "tok_s", "ms_per_step", "step_p99_ms",
                "pct_of_ceiling", "verify6_over_step", "capture_ms"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description="decode latency benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shapes", nargs="+", default=["tinyllama", "default"], choices=["tinyllama", "default"],
                   help="CUDA only")
    p.add_argument("--formats", nargs="+", default=["bf16", "int8", "q4"], help="CUDA only")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="CUDA only")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    def save(result):
        result["provenance"] = provenance(args.device)
        write_results(args.out, f"latency-{args.device}", result, markdown(result, args.device))

    result = cpu_bench(args) if args.device == "cpu" else cuda_bench(args, save)
    save(result)
    print(markdown(result, args.device))


if __name__ == "__main__":
    main()
