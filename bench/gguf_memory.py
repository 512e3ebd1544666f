"""What a real-sized K-quant file costs us against llama.cpp: peak RSS, model-cache disk, load time and decode tok/s
against the file's size, on random-weight Q4_K_M files of Qwen2.5's shapes (1.5B, 3B, 7B) made by llama.cpp's own
llama-quantize (bench/random_gguf.py kquant_file: from a random F16 file written a tensor at a time, removed
afterwards).

Every measurement runs in a fresh process of its own, so its peak RSS (VmHWM) is that measurement's alone and
each start is a user's start: first ours on a fresh model cache (the cold start: the file
indexed), then ours (a warm start: load, then greedy decoding through Engine.stream) and llama-bench tg on the same
file, alternating, `--repeats` times each (median of each; llama-bench from a bare environment, PATH and HOME only,
with ours' thread count). The read bandwidth is probed in a process of its own (its 512 MB buffer in no measured
process) before the first and after every run, and a step is set against it twice: bytes a step reads (every
projection and norm, the KV cache it attends over) / step time / ceiling, with the ceiling the best probe of the
whole row (the median run against the best moment of several minutes: strict on a box whose bandwidth drifts),
and run by run against the better of the two probes either side of that run (the bandwidth measured around it;
the median of the runs' ratios). The KV cache ours allocates
is reported beside its RSS (the goal: peak RSS <= 1.3x the file plus that cache), and the RSS of a process that
only imported engine and loaded the CPU kernels (`baseline`), the share of that figure no model brings.

    python -m bench.gguf_memory --shapes 1.5B 3B --folder /tmp/kq   # -> bench/results/gguf-memory-cpu.{json,md}
    python -m bench.gguf_memory --shapes --files gemma-3-270m-q4_k_m.gguf   # real files, as they are
    nice -n 5 python -m bench.gguf_memory --shapes 7B --folder /tmp/kq --delete-files --name gguf-memory-7b-cpu
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import random_gguf
from engine.timing import peak_rss, proc_status


def run_watched(cmd: list[str], env: dict, every_s: float = 0.01) -> tuple[subprocess.CompletedProcess, int]:
    """Run cmd to its end, its output captured; -> (the finished process, its own peak RSS in bytes): its VmHWM,
    read every `every_s` until it exits (a high-water mark, so a read only misses what grew in its last
    moment). Not getrusage's RUSAGE_CHILDREN: that carries this process's RSS into the child's (peak_rss)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], proc_status("VmHWM", proc.pid) or 0)
            time.sleep(every_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), peak[0]


def child_baseline() -> dict:
    import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
    from engine import ops

    ops.select("cpu", True, 128)
    return dict(peak_rss=peak_rss(), rss_file=proc_status("RssFile"))


def child_ours(path: Path, cache: Path, prompt_len: int, new_tokens: int, decode: bool) -> dict:
    import engine  # noqa: F401
    from bench.scaling import ours_decode
    from bench.steps import prompt_ids
    from engine import Engine, load_model, ops

    ops.select("cpu", True, 128)  # the CPU kernels built or loaded before the clock starts: a build is no load
    start = time.perf_counter()
    model = load_model(path, cache_dir=cache, progress=lambda s: None)
    out = dict(load_s=time.perf_counter() - start, notes=model.load_notes, rss_after_load=peak_rss(),
               cache_bytes=sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()))
    out["packed_bytes"] = sum(m.weight.nbytes for m in model.linears()) + sum(
        b.numel() * b.element_size() for b in model.buffers())
    if decode:
        eng = Engine(model, max_seq_len=prompt_len + new_tokens + 64)
        out["kv_bytes"] = sum(t.numel() * t.element_size() for t in (eng.cache.k, eng.cache.v))
        ids = prompt_ids(min(random_gguf.VOCAB, model.config.vocab_size), prompt_len)
        r = ours_decode(eng, ids, new_tokens, repeats=1)
        # a step's reads: every weight it streams, and the K/V of the positions it attends over (mid-run)
        out["step_bytes"] = eng.weight_bytes + eng.cache.bytes_per_token * (prompt_len + new_tokens // 2)
        out["tok_s"], out["mean_tok_s"] = r["tok_s"], r["mean_tok_s"]
    out["peak_rss"] = peak_rss()
    return out


def child_probe() -> dict:
    from engine.observe.bandwidth import measure_gbs

    return dict(gbs=measure_gbs("cpu"))


def child_bench(path: Path, threads: int, prompt_len: int, new_tokens: int) -> dict:
    from bench import llamacpp

    cmd = llamacpp.bench_command(path, threads, 2, llamacpp.tg_test(new_tokens, prompt_len))
    bare = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    done, peak = run_watched(cmd, bare)
    test = llamacpp.bench_result(done)
    return dict(tg_tok_s=test["avg_ts"], tg_test=f"tg{new_tokens}@d{prompt_len}", threads=threads,
                peak_rss=peak)


def in_child(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench.gguf_memory", "--child", *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.gguf_memory child {args} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(shape: str, args, baseline: dict, path: Path | None = None) -> dict:
    """One shape's row (its random Q4_K_M file, made if missing), or a real file's (path; shape: its name)."""
    made = path is None
    path = random_gguf.kquant_file(shape, Path(args.folder)) if made else path
    size = path.stat().st_size
    run = (str(args.prompt_len), str(args.new_tokens))
    probes, ours, bench = [in_child("probe")["gbs"]], [], []
    with tempfile.TemporaryDirectory(prefix="gguf-memory-cache-") as cache:
        cold = in_child("ours", str(path), cache, *run, "cold")
        for _ in range(args.repeats):
            ours.append(in_child("ours", str(path), cache, *run, "decode"))
            probes.append(in_child("probe")["gbs"])
            bench.append(in_child("bench", str(path), str(args.threads), *run))
            probes.append(in_child("probe")["gbs"])
    if args.delete_files and made:
        path.unlink()
    gb, med = 1e9, statistics.median
    peak, kv, ceiling = max(r["peak_rss"] for r in ours), ours[0]["kv_bytes"], max(probes)
    tok_s, bench_tok_s = med(r["tok_s"] for r in ours), med(r["tg_tok_s"] for r in bench)
    step_bytes = ours[0]["step_bytes"]
    # run i of ours sits between probes 2i and 2i + 1, llama-bench's run i between 2i + 1 and 2i + 2
    near = [max(probes[2 * i], probes[2 * i + 1]) for i in range(len(ours))]
    near_bench = [max(probes[2 * i + 1], probes[2 * i + 2]) for i in range(len(bench))]
    # run i of ours against llama-bench's run i, the next one: the same statistic (tokens over their time) on the
    # box as it was within half a minute, where the medians of the two columns may each fall in another of its moods
    paired = [o["mean_tok_s"] / b["tg_tok_s"] for o, b in zip(ours, bench, strict=True)]
    like = random_gguf.BIG_SHAPES[shape]["like"] if made else "a real file"
    return dict(shape=shape, like=like, file_gb=size / gb,
                ours_peak_rss_gb=peak / gb, kv_gb=kv / gb, rss_over_file_plus_kv=peak / (size + kv),
                baseline_rss_gb=baseline["peak_rss"] / gb, baseline_file_gb=baseline["rss_file"] / gb,
                baseline_over_file_plus_kv=baseline["peak_rss"] / (size + kv),
                cold_peak_rss_gb=cold["peak_rss"] / gb, bench_peak_rss_gb=max(r["peak_rss"] for r in bench) / gb,
                cache_mb=cold["cache_bytes"] / 1e6, cache_over_file=cold["cache_bytes"] / size,
                packed_gb=ours[0]["packed_bytes"] / gb, cold_load_s=cold["load_s"],
                warm_load_s=med(r["load_s"] for r in ours), ours_tok_s=tok_s, bench_tg_tok_s=bench_tok_s,
                ours_over_bench=tok_s / bench_tok_s, step_gb=step_bytes / gb, bandwidth_gbs=ceiling,
                ours_pct_of_bandwidth=100 * step_bytes * tok_s / ceiling / gb,
                bench_pct_of_bandwidth=100 * step_bytes * bench_tok_s / ceiling / gb, probes_gbs=probes,
                ours_pct_of_near_probes=med(100 * step_bytes * r["tok_s"] / p / gb
                                            for r, p in zip(ours, near, strict=True)),
                bench_pct_of_near_probes=med(100 * step_bytes * r["tg_tok_s"] / p / gb
                                             for r, p in zip(bench, near_bench, strict=True)),
                ours_mean_tok_s=med(r["mean_tok_s"] for r in ours),
                ours_over_bench_paired=med(paired), paired_lo=min(paired), paired_hi=max(paired),
                ours_tok_s_runs=[r["tok_s"] for r in ours], bench_tok_s_runs=[r["tg_tok_s"] for r in bench],
                ours_mean_tok_s_runs=[r["mean_tok_s"] for r in ours],
                warm_load_s_runs=[r["load_s"] for r in ours], bench_test=bench[0]["tg_test"], threads=args.threads,
                notes=ours[0]["notes"])


def markdown(result: dict) -> str:
    from bench.common import markdown_table

    head = (f"Random-weight Q4_K_M files (llama-quantize from a random F16 file) of the shapes named, with their "
            f"vocabulary's {random_gguf.QWEN25_VOCAB} embedding rows (SmolLM2's {random_gguf.VOCAB} tokens, the rest "
            "unused [PAD] tokens, as llama.cpp pads Qwen2.5's), and real files as they are (`like`: a real file). "
            "Each figure from a fresh process: ours cold (a fresh "
            f"model cache) once, then ours warm and llama-bench alternating, {result['repeats']} of each (medians; "
            f"peak RSS the largest, VmHWM). Ours: load_model, then Engine.stream's median step over "
            f"{result['new_tokens']} greedy tokens after a {result['prompt_tokens']}-token prompt; llama-bench: tg "
            f"at that depth, {result['threads']} threads, a bare environment. baseline: a process that only "
            "imported engine and loaded its CPU kernels; baseline_file: the part of it that is shared libraries' "
            "pages mapped from the page cache (torch's, mostly), which moves with how those pages sit there: after "
            "a sequential read of the library (a copy, an install) its pages are cached in 2 MB folios that a "
            "process maps whole, ~90 MB more than when they were faulted in from disk. % of bandwidth: bytes a "
            "step reads / step time / the best read-bandwidth probe of the row; % of near probes: the same run by "
            "run against the better of the two "
            "probes either side of it (median). cache: the model cache's bytes after the cold load. ours_mean_tok_s: "
            "each run's tokens over their time, as llama-bench's tg counts (ours_tok_s: from the median step); "
            "ours_over_bench_paired: the median over the runs of that figure against the llama-bench run right after "
            "it (paired_lo, paired_hi: the extremes).\n\n")
    cols = ["shape", "like", "file_gb", "ours_peak_rss_gb", "kv_gb", "rss_over_file_plus_kv", "baseline_rss_gb",
            "baseline_file_gb", "baseline_over_file_plus_kv", "bench_peak_rss_gb", "cache_mb", "cache_over_file",
            "cold_load_s", "warm_load_s", "ours_tok_s", "bench_tg_tok_s", "ours_over_bench", "ours_mean_tok_s",
            "ours_over_bench_paired", "paired_lo", "paired_hi", "bandwidth_gbs",
            "ours_pct_of_bandwidth", "bench_pct_of_bandwidth", "ours_pct_of_near_probes", "bench_pct_of_near_probes"]
    return head + markdown_table(result["rows"], cols)


CHILDREN = {"baseline": child_baseline, "probe": child_probe,
            "ours": lambda path, cache, n, m, mode: child_ours(Path(path), Path(cache), int(n), int(m),
                                                                mode == "decode"),
            "bench": lambda path, threads, n, m: child_bench(Path(path), int(threads), int(n), int(m))}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        print(json.dumps(CHILDREN[argv[1]](*argv[2:])))
        return
    import torch

    from bench.common import run_and_save

    p = argparse.ArgumentParser(description="RSS, disk, load time and tok/s on K-quant files against llama.cpp")
    p.add_argument("--shapes", nargs="*", default=["1.5B"], choices=list(random_gguf.BIG_SHAPES))
    p.add_argument("--files", nargs="*", default=[], type=Path, metavar="GGUF",
                   help="real GGUF files to measure as they are (after the shapes; never deleted)")
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "decodescope-kquant"),
                   help="where the random files are made (the F16 one is removed once quantized)")
    p.add_argument("--delete-files", action="store_true", help="remove each Q4_K_M file after its row")
    p.add_argument("--repeats", type=int, default=3, help="warm runs of ours and of llama-bench, alternating")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="llama-bench's (ours: torch's)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--name", default="gguf-memory-cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)

    def run(save):
        out = dict(prompt_tokens=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                   threads=args.threads, rows=[])
        baseline = in_child("baseline")
        for shape, path in [(s, None) for s in args.shapes] + [(f.name, f) for f in args.files]:
            out["rows"].append(row(shape, args, baseline, path))
            print({k: v for k, v in out["rows"][-1].items() if k != "notes"}, flush=True)
            save(out)
        return out

    run_and_save(args.out, args.name, "cpu", run, markdown)


if __name__ == "__main__":
    main()
