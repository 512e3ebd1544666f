"""Decode speed against llama.cpp on the same GGUF file, paired second by second: ours, llama.cpp's llama-server and
its llama-bench take turns with short bursts, so each ratio compares runs the box made within a few seconds.

The box's read bandwidth moves between two levels (~37 and ~65 GB/s on the Zen 4) within seconds, and a decode
step streams the whole file: two engines timed in fresh processes half a minute apart (bench/gguf_memory.py) often
meet different levels, and their ratio swings by a third from run to run. Here both stay loaded for the whole row:
ours in this process (load_model + Engine.stream, greedy), llama-server in its own (a clean environment, the same
threads), and a cycle runs a burst of `--tokens` greedy steps on each and one llama-bench tg of the same length and
depth (a fresh process: its load is outside its timing), in an order rotated cycle by cycle.

Every figure is tokens over their time for the steps after the first (the first token comes from the prompt's
prefill): ours from its steps' clocks, llama-server's from its `timings` (its clock starts at the first token, so
predicted_n - 1 steps over predicted_ms), llama-bench's its own tg. Ours and llama-server's each include a greedy
pick over the whole vocabulary per token; llama-bench's tg samples nothing. Reported: the median and extremes of
the per-cycle ratios, and each engine's median.

    python -m bench.paired_decode --shapes 1.5B 3B --folder /tmp/kq --files gemma-3-270m-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
import httpx
import torch

from bench import llamacpp, random_gguf
from bench.steps import prompt_ids
from engine import Engine, load_model, ops
from engine.checkpoint.load import KV_CACHES
from engine.endpoint.llamacpp import LlamaServer

GAP_S = 0.05  # between bursts: a finished engine's threads go quiet before the next one starts


def ours_burst(eng: Engine, prompt: list[int], tokens: int) -> float:
    rounds = list(eng.stream(prompt, tokens + 1, stop_ids=[]))
    steps = [r.total_ms for r in rounds[1:]]
    return 1e3 * len(steps) / sum(steps)


def server_burst(client: httpx.Client, root: str, prompt: list[int], tokens: int) -> float:
    r = client.post(root + "/completion", json=dict(prompt=prompt, n_predict=tokens + 1, cache_prompt=True,
                                                    ignore_eos=True, temperature=0.0))
    r.raise_for_status()
    t = r.json()["timings"]
    if t["predicted_n"] != tokens + 1:
        raise RuntimeError(f"llama-server predicted {t['predicted_n']} tokens, {tokens + 1} asked")
    return 1e3 * (t["predicted_n"] - 1) / t["predicted_ms"]


def bench_burst(path: Path, threads: int, tokens: int, depth: int) -> float:
    cmd = llamacpp.bench_command(path, threads, 1, llamacpp.tg_test(tokens, depth))
    done = subprocess.run(cmd, capture_output=True, text=True, env=llamacpp.clean_env(), check=False)
    return llamacpp.bench_result(done)["avg_ts"]


def spread(values: list[float]) -> dict:
    return dict(median=statistics.median(values), lo=min(values), hi=max(values))


def row(name: str, path: Path, args) -> dict:
    ops.select("cpu", True, 128)
    model = load_model(path, progress=lambda s: None, kv_cache=args.kv_cache)
    eng = Engine(model, max_seq_len=args.prompt_len + args.tokens + 64)
    prompt = prompt_ids(min(random_gguf.VOCAB, model.config.vocab_size), args.prompt_len)
    runs = {"ours": [], "server": [], "bench": []}
    exe = llamacpp.server_binary()
    if exe is None:
        raise FileNotFoundError(llamacpp.binaries_missing())
    with LlamaServer(path, threads=args.threads, exe=str(exe),
                     ctx=args.prompt_len + args.tokens + 64) as srv, \
            httpx.Client(trust_env=False, timeout=300) as client:
        burst = {"ours": lambda: ours_burst(eng, prompt, args.tokens),
                 "server": lambda: server_burst(client, srv.root, prompt, args.tokens),
                 "bench": lambda: bench_burst(path, args.threads, args.tokens, args.prompt_len)}
        burst["ours"](), burst["server"]()  # warm-up: pages touched, caches filled
        order = list(burst)
        for i in range(args.cycles):
            for who in order[i % 3:] + order[:i % 3]:
                time.sleep(GAP_S)
                runs[who].append(burst[who]())
            print(name, i, {k: round(v[-1], 2) for k, v in runs.items()}, flush=True)
    med = statistics.median
    pair = lambda a, b: spread([x / y for x, y in zip(runs[a], runs[b], strict=True)])  # noqa: E731
    out = dict(file=name, file_gb=path.stat().st_size / 1e9, cycles=args.cycles,
               kv_cache=str(eng.cache.k.dtype).removeprefix("torch."),
               ours_tok_s=med(runs["ours"]), server_tok_s=med(runs["server"]), bench_tok_s=med(runs["bench"]),
               ours_over_bench=pair("ours", "bench"), ours_over_server=pair("ours", "server"),
               server_over_bench=pair("server", "bench"),
               ours_ahead_of_bench=sum(o >= b for o, b in zip(runs["ours"], runs["bench"], strict=True)) / args.cycles,
               runs=runs)
    return out


def markdown(result: dict) -> str:
    from bench.common import markdown_table

    head = (f"Decode tok/s on one GGUF file, ours against llama.cpp's llama-server and llama-bench taking turns: "
            f"{result['cycles']} cycles of a {result['tokens']}-token greedy burst each after a "
            f"{result['prompt_tokens']}-token prompt, {result['threads']} threads, the order rotated cycle by cycle; "
            "tokens over their time for the steps after the first (llama-server's from its timings, llama-bench's "
            "tg at that depth). Ratios: the median (lowest-highest) of the cycles' own ratios.\n\n")
    rows = []
    for r in result["rows"]:
        cell = lambda s: f"{s['median']:.3f} ({s['lo']:.2f}-{s['hi']:.2f})"  # noqa: E731
        rows.append(dict(file=r["file"], file_gb=r["file_gb"], ours_kv=r.get("kv_cache", "float32"),
                         ours_tok_s=r["ours_tok_s"],
                         server_tok_s=r["server_tok_s"], bench_tok_s=r["bench_tok_s"],
                         ours_over_bench=cell(r["ours_over_bench"]), ours_over_server=cell(r["ours_over_server"]),
                         server_over_bench=cell(r["server_over_bench"]),
                         ours_ahead_of_bench=f"{100 * r['ours_ahead_of_bench']:.0f}%"))
    return head + markdown_table(rows, list(rows[0]) if rows else ["file"])


def main(argv=None):
    from bench.common import run_and_save

    p = argparse.ArgumentParser(description="decode tok/s against llama.cpp on one file, burst by burst")
    p.add_argument("--shapes", nargs="*", default=None, choices=list(random_gguf.BIG_SHAPES),
                   help="random files of these shapes in --kind's mix (made in --folder if missing; default: 1.5B "
                        "where no --files are given)")
    p.add_argument("--kind", default="Q4_K_M", choices=random_gguf.KQUANT_KINDS,
                   help="llama-quantize's mix for the random files")
    p.add_argument("--files", nargs="*", default=[], type=Path, metavar="GGUF", help="real GGUF files, as they are")
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-kquant"))
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--tokens", type=int, default=16, help="greedy steps a burst times")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--kv-cache", choices=KV_CACHES, default="auto",
                   help="ours' KV cache (load_model's kv_cache; auto, as the app runs: fp16, llama.cpp's default f16)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--name", default="paired-decode-cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)

    def run(save):
        out = dict(tokens=args.tokens, prompt_tokens=args.prompt_len, threads=args.threads,
                   cycles=args.cycles, llamacpp=llamacpp.describe(), rows=[])
        shapes = args.shapes if args.shapes is not None else [] if args.files else ["1.5B"]
        files = [(f"random {s} {args.kind}", random_gguf.kquant_file(s, Path(args.folder), args.kind))
                 for s in shapes]
        for name, path in files + [(f.name, f) for f in args.files]:
            out["rows"].append(row(name, path, args))
            save(out)
        return out

    run_and_save(args.out, args.name, "cpu", run, markdown)


if __name__ == "__main__":
    main()
