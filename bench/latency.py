"""Decode latency, measured as ratios within one run.

CPU:  the embedded default model, batch 1, a 128-token prompt, 128 greedy tokens: transformers (fp32), our
      twins (fp32), our fused kernels in every weight format, and llama.cpp on the same GGUF file in the
      types of the same bytes per weight (when llama-cpp-python is installed); TTFT, ms per step, achieved
      GB/s and % of the read bandwidth measured in the same run, and a 6-token verify pass over one step.
CUDA: weight formats x torch/fused x eager/graph at batch 1 and 8, on random weights of TinyLlama-1.1B's and
      the default model's shapes.

    python -m bench.latency --device cpu
    python -m bench.latency --device cuda --out bench/results
    python -m bench.latency --device cuda --shapes tinyllama --formats bf16 --kernels fused --batch 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import markdown_table, run_and_save
from bench.steps import cpu_path, prompt_ids, shape_config, step_ms, verify_costs
from engine import Engine, load_model
from engine.observe.bandwidth import measure_gbs
from engine.checkpoint import random_model
import torch

TEXT = Path(__file__).parent / "data" / "prose.txt"

def transformers_decode(model_path, prompt, new_tokens) -> dict:
    """transformers' greedy generate on the same fp32 weights: TTFT = generate(1 token), ms per token =
    (t(n) - t(1)) / (n - 1), best of three each."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])

    def run(n):
        t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return (time.perf_counter() - t) * 1e3, out[0, len(prompt):].tolist()

    run(4)  # warm-up
    t1 = min(run(1)[0] for _ in range(3))
    tn, out = min(run(new_tokens) for _ in range(2))
    ms = (tn - t1) / (new_tokens - 1)
    return dict(ttft_ms=t1, ms_per_token=ms, tok_s=1e3 / ms, ids=out)


@torch.inference_mode()
def ours_decode(eng: Engine, prompt, new_tokens, repeats: int = 3) -> dict:
    """TTFT (prefill + the first pick) and the median step of greedy decoding through Engine.stream, the
    loop the app runs, best of `repeats`; plus a 6-token verify pass over one step."""
    eng.generate(prompt, 8, stop_ids=[])  # warm-up
    best = None
    for _ in range(repeats):
        rounds = list(eng.stream(prompt, new_tokens, stop_ids=[]))
        step = statistics.median(r.total_ms for r in rounds[1:])
        if best is None or step < best[1]:
            best = (rounds[0].t_end_ms, step, [r.tokens[0].token_id for r in rounds])
    ttft, ms, ids = best
    verify = verify_costs(eng, prompt, ts=(6,))
    return dict(ttft_ms=ttft, ms_per_token=ms, tok_s=1e3 / ms, ids=ids, verify6_over_step=verify["verify6_over_step"])


ROUNDS = 2  # rounds of ours against llama.cpp per weight format
KERNELS = {"both": (False, True), "fused": (True,), "torch": (False,)}  # CUDA: which op sets to time


def faster(best: dict | None, r: dict) -> dict:
    return r if best is None or r["ms_per_token"] < best["ms_per_token"] else best


def cpu_bench(args, save) -> dict:
    """One run, side by side: transformers fp32; decodescope's twins (fp32) and fused kernels in every
    format; llama.cpp on the default model's GGUF file in the types of the same bytes per weight."""
    from bench import llamacpp
    from engine import Tokenizer
    from engine.checkpoint import default_model

    bw = measure_gbs("cpu")
    tok = Tokenizer(load_model(None, weights="fp32", progress=lambda msg: None).path)
    prompt = tok.encode(TEXT.read_text())[: args.prompt_len]
    out = dict(model="SmolLM2-135M-Instruct (embedded default)", batch=1, prompt_tokens=len(prompt),
               new_tokens=args.new_tokens, threads=torch.get_num_threads(), bandwidth_gbs=bw, isa=cpu_path(), rows=[],
               llamacpp=llamacpp.unavailable() or "llama-cpp-python " + __import__("llama_cpp").__version__,
               llamacpp_info=llamacpp.describe(), llamacpp_f32_mismatch=None)

    ceiling = [bw]  # the read bandwidth around each row: this shared machine's moves between runs

    def add(engine_name, fmt, path, weight_bytes, r):
        ids = r.pop("ids")
        after = measure_gbs("cpu")
        row_bw = max(ceiling[-1], after)  # measured before and after the row: the larger is its ceiling
        ceiling.append(after)
        row = dict(engine=engine_name, weights=fmt, path=path, **r, weight_mb=weight_bytes / 1e6,
                   gb_s=weight_bytes / r["ms_per_token"] / 1e6, bandwidth_gbs=row_bw,
                   pct_of_ceiling=100 * weight_bytes / r["ms_per_token"] / 1e6 / row_bw, same_tokens_as_fp32=None)
        out["rows"].append(row)
        out["bandwidth_range_gbs"] = [min(ceiling), max(ceiling)]
        print({k: v for k, v in row.items()}, flush=True)
        save(out)
        return ids

    fp32 = load_model(None, weights="fp32", fused=False)
    ref_ids = add("transformers", "fp32", "torch", fp32.weight_bytes, transformers_decode(fp32.path, prompt,
                                                                                          args.new_tokens))
    eng = Engine(fp32, max_seq_len=len(prompt) + args.new_tokens + 64)
    same = add("decodescope", "fp32", fp32.ops.name, fp32.weight_bytes, ours_decode(eng, prompt, args.new_tokens))
    out["rows"][-1]["same_tokens_as_fp32"] = same == ref_ids
    del fp32, eng
    for fmt in args.formats:
        model = load_model(None, weights=fmt)
        eng = Engine(model, max_seq_len=len(prompt) + args.new_tokens + 64)
        path = None
        if out["llamacpp"].startswith("llama-cpp-python"):
            path = llamacpp.model_file(default_model.gguf_path(progress=lambda msg: None), fmt)
        # ours and llama.cpp alternate, each keeping its better round: this shared machine's bandwidth moves
        # within minutes, and a pair timed once each can land in different regimes
        ours = theirs = bench = None
        for _ in range(ROUNDS):
            ours = faster(ours, ours_decode(eng, prompt, args.new_tokens))
            if path is not None:
                theirs = faster(theirs, llamacpp.time_decode(path, prompt, args.new_tokens, torch.get_num_threads()))
            if path is not None and llamacpp.bench_binary() is not None:  # llama.cpp's own C++ timing
                b = llamacpp.llama_bench(path, torch.get_num_threads(), args.new_tokens, len(prompt), len(prompt))
                bench = b if bench is None or b["tg_tok_s"] > bench["tg_tok_s"] else bench
        our_ids = add("decodescope", fmt, model.ops.name, model.weight_bytes, ours)
        out["rows"][-1]["same_tokens_as_fp32"] = our_ids == ref_ids
        if theirs is not None:
            kind = llamacpp.formats()[fmt]
            cmp = llamacpp.compare_ids(eng, prompt, our_ids, theirs)
            theirs.pop("margins")
            ids = add("llama.cpp", kind, "ggml", path.stat().st_size, dict(theirs, **(bench or {})))
            out["rows"][-1].update(same_tokens_as_fp32=ids == ref_ids, ids_vs_ours=llamacpp.ids_cell(cmp), **cmp)
            try:
                llamacpp.check_same_f32(kind, "the default model", cmp)
            except AssertionError as e:  # saved with the results, raised by main() after them
                out["llamacpp_f32_mismatch"] = str(e)
        del model, eng
    return out


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
            for fused in KERNELS[args.kernels]:
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
               weight_gb=model.weight_bytes / 1e9, gb_s=model.weight_bytes / ms / 1e6,
               pct_of_ceiling=100 * (1e3 / ms) / steps_per_s_ceiling,
               capture_ms=eng.graph.capture_ms.get("decode") if eng.graph else None,
               status=f"{eng.kernel_status} | {eng.graph_status}")
    if batch == 1:
        row.update({k: v for k, v in verify_costs(eng, prompt, ts=(6,)).items() if k.startswith("verify")})
    return row


def markdown(result: dict, device: str) -> str:
    if device == "cpu":
        head = (f"Decode on CPU ({result['threads']} threads), {result['model']}, batch 1, "
                f"{result['prompt_tokens']}-token prompt (bench/data/prose.txt), {result['new_tokens']} greedy tokens, "
                "all in one run. The read bandwidth is measured before and after every row (this shared machine's "
                "moved within %.0f-%.0f GB/s during the run); a row's ceiling is the larger of its two, and "
                "%% of ceiling = weight bytes per step / step time over it. Fused kernels: " % tuple(
                    result.get("bandwidth_range_gbs", [result["bandwidth_gbs"]] * 2)) +
                f"{result.get('isa', 'path not recorded')}. llama.cpp: {result['llamacpp']}.\n\n")
        head += ("llama.cpp rows: its Python loop's figures (f32 KV cache and no flash attention, as ours), "
                 "llama-bench's tg/pp tok/s beside them (C++, as llama.cpp ships it: f16 KV cache, flash attention "
                 "auto), and its greedy ids against ours in the same format "
                 "(ids_vs_ours: where they part, with both top-1 margins there).\n\n")
        cols = ["engine", "weights", "path", "tok_s", "ttft_ms", "ms_per_token", "weight_mb", "gb_s",
                "bandwidth_gbs", "pct_of_ceiling", "verify6_over_step", "same_tokens_as_fp32", "bench_tg_tok_s",
                "bench_pp_tok_s", "ids_vs_ours"]
    else:
        head = (f"Decode on CUDA; copy bandwidth {result['bandwidth_gbs']:.0f} GB/s measured in the same run; gb_s: "
                "weight bytes per step over the step's time.\n\n")
        cols = ["shape", "weights", "kernels", "graph", "batch", "tok_s", "ms_per_step", "step_p99_ms", "gb_s",
                "pct_of_ceiling", "verify6_over_step", "capture_ms"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description="decode latency benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shapes", nargs="+", default=["tinyllama", "default"], choices=["tinyllama", "default"],
                   help="CUDA only")
    p.add_argument("--formats", nargs="+", default=None,
                   help="default: fp32 fp16 int8 q4 on CPU, bf16 int8 q4 on CUDA")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="CUDA only")
    p.add_argument("--kernels", default="both", choices=sorted(KERNELS), help="CUDA only: the fused kernels, the "
                   "torch twins, or both")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    args.formats = args.formats or (["fp32", "fp16", "int8", "q4"] if args.device == "cpu" else ["bf16", "int8", "q4"])
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    result = run_and_save(args.out, f"latency-{args.device}", args.device,
                          lambda save: cpu_bench(args, save) if args.device == "cpu" else cuda_bench(args, save),
                          lambda result: markdown(result, args.device))
    if result.get("llamacpp_f32_mismatch"):
        sys.exit(result["llamacpp_f32_mismatch"])


if __name__ == "__main__":
    main()
