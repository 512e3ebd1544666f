"""Ours against llama.cpp as the model grows: decode tok/s and % of the read bandwidth per weight format, for
random-weight llama models of SmolLM2-135M's (the default model's), SmolLM2-360M's and TinyLlama-1.1B's shapes,
both engines on the SAME GGUF file (bench/random_gguf.py writes them once into the cache).

Per shape and format, in one run: our engine through Engine.stream (the app's loop) on the file as
engine/checkpoint/gguf_convert.py reads it (Q4_1 and Q8_0 blocks kept as they are), llama.cpp's Python loop
(llama-cpp-python) and its C++ llama-bench (tg at a depth of the prompt, and pp), alternating over `--rounds`
rounds, each keeping its best; the read bandwidth is measured before and after every row, and the larger is the
row's ceiling. % of ceiling = the bytes a step reads (every projection, norm and the head; one row of an untied
embedding) / step time / ceiling. Greedy ids: llama.cpp's loop against ours; in F32 they must be the same.

    python -m bench.scaling                                  # -> bench/results/scaling-cpu.{json,md}
    python -m bench.scaling --shapes 135M --formats q4 --rounds 1

Our converted copy of each file (an fp32 folder, up to 5 GB for 1.1B) is removed after its row unless
--keep-converted: the GGUF files stay in the cache, and a rerun converts again (about a minute each).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench import llamacpp, random_gguf
from bench.common import markdown_table, run_and_save
from bench.steps import prompt_ids
from engine import Engine, load_model
from engine.observe.bandwidth import measure_gbs
import torch

FORMATS = ("fp32", "fp16", "int8", "q4")


def step_bytes(shape: str, kind: str) -> int:
    """Bytes one decode step reads from the file: every tensor but an untied embedding (one row of it)."""
    s = random_gguf.SHAPES[shape]
    tensors = random_gguf.hf_tensors(s, random_gguf.VOCAB)
    return sum(random_gguf.tensor_info(dims, random_gguf.stored_type(kind, role))[2]
               for name, dims, role, _ in tensors if not (name == "token_embd.weight" and not s["tied"]))


@torch.inference_mode()
def ours_decode(eng: Engine, prompt: list[int], new_tokens: int, repeats: int = 2) -> dict:
    """The median step of greedy decoding through Engine.stream, best of `repeats`, and its ids; mean_tok_s: the
    same run's tokens over their time (every step after the first), the figure llama-bench's tg reports."""
    eng.generate(prompt, 8, stop_ids=[])  # warm-up
    best = None
    for _ in range(repeats):
        rounds = list(eng.stream(prompt, new_tokens, stop_ids=[]))
        steps = [r.total_ms for r in rounds[1:]]
        step = statistics.median(steps)
        if best is None or step < best["ms_per_token"]:
            best = dict(ms_per_token=step, tok_s=1e3 / step, mean_tok_s=1e3 * len(steps) / sum(steps),
                        ids=[r.tokens[0].token_id for r in rounds])
    return best


def faster(best: dict | None, r: dict, key: str = "tok_s") -> dict:
    return r if best is None or r[key] > best[key] else best


def one_row(shape: str, fmt: str, args, threads: int, ceiling: list[float]) -> tuple[dict, dict]:
    """Ours, llama.cpp's loop and llama-bench on random-{shape}-{kind}.gguf, alternating; the row and the
    ids comparison."""
    kind = llamacpp.formats()[fmt]
    path = random_gguf.path(random_gguf.ensure(shape), shape, kind)
    model = load_model(path, weights=fmt, progress=lambda msg: None)
    converted = model.path
    eng = Engine(model, max_seq_len=args.prompt_len + args.new_tokens + 64)
    prompt = prompt_ids(random_gguf.VOCAB, args.prompt_len)
    ours = loop = bench = None
    for _ in range(args.rounds):
        ours = faster(ours, ours_decode(eng, prompt, args.new_tokens))
        loop = faster(loop, llamacpp.time_decode(path, prompt, args.new_tokens, threads, repeats=2))
        bench = faster(bench, llamacpp.llama_bench(path, threads, n_gen=args.new_tokens, depth=args.prompt_len,
                                                   n_prompt=args.prompt_len), key="tg_tok_s")
    cmp = llamacpp.compare_ids(eng, prompt, ours["ids"], loop)
    del model, eng
    if not args.keep_converted and converted.name.startswith("random-"):  # our cache's copy of a random file
        shutil.rmtree(converted, ignore_errors=True)
    after = measure_gbs("cpu")
    bw = max(ceiling[-1], after)
    ceiling.append(after)
    nbytes = step_bytes(shape, kind)

    def pct(tok_s):
        return 100 * nbytes * tok_s / 1e9 / bw

    row = dict(shape=shape, weights=fmt, gguf=kind, weight_mb=nbytes / 1e6, ours_tok_s=ours["tok_s"],
               loop_tok_s=loop["tok_s"], bench_tg_tok_s=bench["tg_tok_s"], bench_pp_tok_s=bench["pp_tok_s"],
               ours_pct=pct(ours["tok_s"]), loop_pct=pct(loop["tok_s"]), bench_pct=pct(bench["tg_tok_s"]),
               ours_over_bench=ours["tok_s"] / bench["tg_tok_s"], bandwidth_gbs=bw, greedy_ids=llamacpp.ids_cell(cmp),
               ours_ms=ours["ms_per_token"], loop_ms=loop["ms_per_token"], loop_ttft_ms=loop["ttft_ms"],
               bench_tg_stddev=bench["tg_stddev"], bench_tests=f"{bench['tg_test']}, {bench['pp_test']}",
               llamacpp_child=loop["child"], file=loop["file"], **cmp)
    return row, cmp


def run(args, save) -> dict:
    threads = torch.get_num_threads()
    bw = measure_gbs("cpu")
    out = dict(shapes={s: random_gguf.SHAPES[s] for s in args.shapes}, vocab=random_gguf.VOCAB,
               prompt_tokens=args.prompt_len, new_tokens=args.new_tokens, rounds=args.rounds, threads=threads,
               bandwidth_gbs=bw, llamacpp=llamacpp.describe(), rows=[], f32_mismatches=[])
    ceiling = [bw]
    for shape in args.shapes:
        for fmt in args.formats:
            row, cmp = one_row(shape, fmt, args, threads, ceiling)
            out["rows"].append(row)
            out["bandwidth_range_gbs"] = [min(ceiling), max(ceiling)]
            try:
                llamacpp.check_same_f32(row["gguf"], f"random {shape}", cmp)
            except AssertionError as e:  # recorded and raised after the run: the other rows still count
                out["f32_mismatches"].append(str(e))
            print({k: row[k] for k in ("shape", "weights", "ours_tok_s", "loop_tok_s", "bench_tg_tok_s", "ours_pct",
                                       "bench_pct", "greedy_ids")}, flush=True)
            save(out)
    return out


def markdown(result: dict) -> str:
    lo, hi = result.get("bandwidth_range_gbs", [result["bandwidth_gbs"]] * 2)
    info = result["llamacpp"]
    bench_version = str(info.get("llama_bench_version", info.get("llama_bench"))).replace("\n", ", ")
    shapes = ", ".join(f"{name} ({s['like']})" for name, s in result["shapes"].items())
    head = (f"Decode on CPU ({result['threads']} threads) as the model grows: random-weight llama models of the shapes "
            f"{shapes}, with a {result['vocab']}-token vocabulary; "
            f"ours and llama.cpp's on the same GGUF file per format, batch 1, a {result['prompt_tokens']}-token "
            f"prompt then {result['new_tokens']} greedy tokens, best of {result['rounds']} alternating rounds. "
            "ours: Engine.stream's median step; loop: llama.cpp's Python binding, the same prompt and steps; "
            f"bench: llama-bench's {result['rows'][0]['bench_tests'] if result['rows'] else 'tg, pp'} (C++, as "
            "llama.cpp ships it: f16 KV cache, flash attention auto; the loop keeps f32 and no flash attention, as "
            "ours). % = bytes a step reads / step time / the read bandwidth "
            f"measured before and after the row (the larger; {lo:.0f}-{hi:.0f} GB/s in this run). greedy_ids: "
            "llama.cpp's loop against ours (where they part, both top-1 margins there). llama.cpp: "
            f"{info.get('python')}; llama-bench: {bench_version}; "
            "weights in memory (use_mmap=False).\n\n")
    cols = ["shape", "weights", "gguf", "weight_mb", "ours_tok_s", "loop_tok_s", "bench_tg_tok_s", "bench_pp_tok_s",
            "ours_pct", "loop_pct", "bench_pct", "ours_over_bench", "bandwidth_gbs", "greedy_ids"]
    tail = "".join(f"\n**F32 ids differ:** {m}\n" for m in result.get("f32_mismatches", []))
    return head + markdown_table(result["rows"], cols) + tail


def main(argv=None):
    p = argparse.ArgumentParser(description="ours against llama.cpp across model shapes and weight formats (CPU)")
    p.add_argument("--shapes", nargs="+", default=list(random_gguf.SHAPES), choices=list(random_gguf.SHAPES))
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--keep-converted", action="store_true", help="keep our converted copy of each random file")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    missing = llamacpp.unavailable() or (None if llamacpp.bench_binary() else llamacpp.bench_missing())
    if missing:
        sys.exit(f"bench.scaling times llama.cpp beside ours: {missing}")
    result = run_and_save(args.out, "scaling-cpu", "cpu", lambda save: run(args, save), markdown)
    if result["f32_mismatches"]:
        sys.exit("llama.cpp's F32 greedy ids differ from ours:\n" + "\n".join(result["f32_mismatches"]))


if __name__ == "__main__":
    main()
