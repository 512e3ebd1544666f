"""What a real-sized K-quant file costs us against llama.cpp: peak RSS, model-cache disk, load time and decode tok/s
against the file's size, on random-weight Q4_K_M files of Qwen2.5's shapes made by llama.cpp's own llama-quantize
(bench/random_gguf.py kquant_file: from a random F16 file written a tensor at a time, removed afterwards).

Each measurement runs in a process of its own, so its peak RSS (getrusage's ru_maxrss) is that measurement's
alone: ours a cold load (the file indexed into a fresh model cache; the CPU kernels loaded before the clock
starts), then a warm one (as a second start finds it), then greedy decoding through Engine.stream; llama-bench tg
on the same file, its RSS read the same way (it memory-maps the file: its RSS counts the file's pages it
touched). The KV cache ours allocates is reported beside its RSS (the goal: peak RSS <= 1.3x the file plus that
cache).

    python -m bench.gguf_memory --shapes 1.5B 3B --folder /tmp/kq   # -> bench/results/gguf-memory-cpu.{json,md}
    nice -n 5 python -m bench.gguf_memory --shapes 7B --folder /tmp/kq --delete-files
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import random_gguf


def child_ours(path: Path, cache: Path, prompt_len: int, new_tokens: int) -> dict:
    import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
    from bench.scaling import ours_decode
    from bench.steps import prompt_ids
    from engine import Engine, load_model, ops

    ops.select("cpu", True, 128)  # the CPU kernels built or loaded before the clock starts: a build is no load
    out = {}
    for when in ("cold", "warm"):
        start = time.perf_counter()
        model = load_model(path, cache_dir=cache, progress=lambda s: None)
        out[f"{when}_load_s"] = time.perf_counter() - start
        if when == "cold":
            del model
    out["notes"] = model.load_notes
    out["packed_bytes"] = sum(m.weight.nbytes for m in model.linears()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    out["rss_after_load"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    eng = Engine(model, max_seq_len=prompt_len + new_tokens + 64)
    out["kv_bytes"] = sum(t.numel() * t.element_size() for t in (eng.cache.k, eng.cache.v))
    r = ours_decode(eng, prompt_ids(random_gguf.VOCAB, prompt_len), new_tokens, repeats=1)
    out["tok_s"] = r["tok_s"]
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["cache_bytes"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    return out


def child_bench(path: Path, threads: int, prompt_len: int, new_tokens: int) -> dict:
    from bench import llamacpp

    r = llamacpp.llama_bench(path, threads, n_gen=new_tokens, depth=prompt_len, n_prompt=prompt_len, repetitions=2)
    r["peak_rss"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return r


def in_child(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.gguf_memory", "--child", *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.gguf_memory child {args} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(shape: str, args) -> dict:
    import torch

    path = random_gguf.kquant_file(shape, Path(args.folder))
    size = path.stat().st_size
    with tempfile.TemporaryDirectory(prefix="gguf-memory-cache-") as cache:
        ours = in_child("ours", str(path), cache, str(args.prompt_len), str(args.new_tokens))
    bench = in_child("bench", str(path), str(torch.get_num_threads()), str(args.prompt_len), str(args.new_tokens))
    if args.delete_files:
        path.unlink()
    gb = 1e9
    return dict(shape=shape, like=random_gguf.BIG_SHAPES.get(shape, random_gguf.SHAPES.get(shape, {})).get("like"),
                file_gb=size / gb, ours_peak_rss_gb=ours["peak_rss"] / gb, kv_gb=ours["kv_bytes"] / gb,
                rss_over_file_plus_kv=ours["peak_rss"] / (size + ours["kv_bytes"]),
                bench_peak_rss_gb=bench["peak_rss"] / gb, cache_mb=ours["cache_bytes"] / 1e6,
                cache_over_file=ours["cache_bytes"] / size, packed_gb=ours["packed_bytes"] / gb,
                cold_load_s=ours["cold_load_s"], warm_load_s=ours["warm_load_s"], ours_tok_s=ours["tok_s"],
                bench_tg_tok_s=bench["tg_tok_s"], ours_over_bench=ours["tok_s"] / bench["tg_tok_s"],
                bench_test=bench["tg_test"], notes=ours["notes"])


def markdown(result: dict) -> str:
    from bench.common import markdown_table

    head = (f"Random-weight Q4_K_M files (llama-quantize from a random F16 file) of the shapes named, SmolLM2's "
            f"{random_gguf.VOCAB}-token vocabulary; ours: load_model on the file (cold: a fresh model cache; warm: "
            f"again), then Engine.stream's median step over {result['new_tokens']} greedy tokens after a "
            f"{result['prompt_tokens']}-token prompt, peak RSS of that whole process (ru_maxrss); llama-bench: "
            "its tg on the same file (mmap, as it ships), peak RSS of its processes. cache: the model cache's "
            "bytes after the load. The load notes say which tensors ran as stand-ins.\n\n")
    cols = ["shape", "like", "file_gb", "ours_peak_rss_gb", "kv_gb", "rss_over_file_plus_kv", "bench_peak_rss_gb",
            "cache_mb", "cache_over_file", "packed_gb", "cold_load_s", "warm_load_s", "ours_tok_s", "bench_tg_tok_s",
            "ours_over_bench"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, path, *rest = argv[1:]
        if kind == "ours":
            r = child_ours(Path(path), Path(rest[0]), int(rest[1]), int(rest[2]))
        else:
            r = child_bench(Path(path), int(rest[0]), int(rest[1]), int(rest[2]))
        print(json.dumps(r))
        return
    from bench.common import run_and_save

    shapes = [*random_gguf.BIG_SHAPES, *random_gguf.SHAPES]
    p = argparse.ArgumentParser(description="RSS, disk, load time and tok/s on K-quant files against llama.cpp")
    p.add_argument("--shapes", nargs="+", default=["1.5B", "3B"], choices=shapes)
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-kquant"),
                   help="where the random files are made (the F16 one is removed once quantized)")
    p.add_argument("--delete-files", action="store_true", help="remove each Q4_K_M file after its row")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--name", default="gguf-memory-cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    Path(args.folder).mkdir(parents=True, exist_ok=True)

    def run(save):
        out = dict(prompt_tokens=args.prompt_len, new_tokens=args.new_tokens, rows=[])
        for shape in args.shapes:
            out["rows"].append(row(shape, args))
            print({k: v for k, v in out["rows"][-1].items() if k != "notes"}, flush=True)
            save(out)
        return out

    run_and_save(args.out, args.name, "cpu", run, markdown)


if __name__ == "__main__":
    main()
