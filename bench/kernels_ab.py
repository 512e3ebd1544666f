"""Two source trees' CPU kernels against each other: a kernel change and the commit before it.

    python -m bench.kernels_ab --baseline /tmp/before --kernels q4_a8 attention --rows 1 6 16 --name kernels-ab-<change>

Each round runs this tree's kernels and the baseline's in fresh processes, one after the other (the order turned
every round), since two builds of the extension cannot share a process. Every process times the same random
inputs (one seed):
  - a GEMM weight format: one thread over a 1536 x 576 matrix resident in L2, T rows (what a verify pass's tiles
    cost when the weights are already there: the instructions, not the memory); one thread over a single panel of
    16 x 1536 (what a call costs beside its tiles: the activations quantized, the fold factors, the handoff); the
    threads asked for (2) over the default model's layer of four GEMMs, its weights in cache (the calls' costs of
    running on the threads: the handoff, another core's activations); and the threads over
    3 layers of Qwen2.5-1.5B's four GEMMs from DRAM, as bench.kernels --alternate times them (the box's bandwidth
    moves these; each process's read probe is recorded);
  - attention: T new queries of the default model's heads (9 query, 3 KV, dim 64) over 30 layers' caches, one
    thread at a 128-token context and the threads at 512, and Qwen2.5-1.5B's (12, 2, 128) over 28 layers at 2,048
    positions, 117 MB of caches read from DRAM (ATTENTION_RUNS);
  - nucleus: a sampled pick's distribution at temperature 0.7 under top-p 0.9 and under top-k 40, T rows of logits
    at real scale (a spread of ~4) of the vocabularies in PICK_VOCABS, on the threads asked for.
Each figure is the minimum over `--repeats` within a process; the table gives the median over rounds for each
tree and the median of the rounds' own new / baseline ratios. The outputs of both trees are compared bit for bit
over ragged shapes (and for attention, windowed caches): a change that moves the bits is a numerics change, not
only a speed-up, and the run says so.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from bench.common import in_tree, markdown_table, provenance, write_results
from bench.kernels import LAYER_SHAPES  # the default model's qkv, o, gate_up, down

HERE = Path(__file__).resolve().parents[1]
COMPUTE_SHAPE = (1536, 576)  # (out, in): 96 panels x 18 blocks of q4, ~0.55 MB, inside a 1 MB L2
PROLOGUE_SHAPE = (16, 1536)  # one panel: a call's own work beside its tiles
STREAM_SHAPES = [(2048, 1536), (1536, 1536), (2 * 8960, 1536), (1536, 8960)]  # Qwen2.5-1.5B: qkv, o, gate_up, down
CHECK_SHAPES = [(960, 576), (1536, 8960), (100, 1000)]  # ragged ones too: a partial panel, a partial block
CHECK_ROWS = (1, 3, 6, 9, 16)
PICK_VOCABS = (49152, 151936, 262144)  # SmolLM2's, Qwen2.5's, Gemma 3's
# (label, threads: 0 for --threads, (query heads, KV heads, head dim), layers, context): the default model's heads
# from cache with one thread and with the threads, and Qwen2.5-1.5B's at a long context, its caches read from DRAM
ATTENTION_RUNS = [("one thread, context 128, 30 layers", 1, (9, 3, 64), 30, 128),
                  ("{threads} threads, context 512, 30 layers", 0, (9, 3, 64), 30, 512),
                  ("{threads} threads, Qwen2.5-1.5B's heads, context 2048, 28 layers", 0, (12, 2, 128), 28, 2048)]

# One process of one tree: times, and the outputs for the bits check. Run with that tree first on sys.path.
CHILD = r"""
import json, sys, time
import engine  # noqa: F401  (OpenMP's wait policy before torch loads)
import torch
from engine.ops import ext
from engine import weights as W
from engine.observe.bandwidth import measure_gbs
kernel, rows, out, isa = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3], sys.argv[4]
repeats, threads, layers = (int(a) for a in sys.argv[5:8])
m = ext.load("cpu").module
if isa:
    m.set_isa(isa)
g = torch.Generator().manual_seed(0)
def best(fn, calls=1):
    fn()
    b = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        b = min(b, (time.perf_counter() - t) / calls)
    return b
res, outs = dict(isa=m.isa(), read_gb_s=measure_gbs("cpu")), []
if kernel == "attention":
    def caches(ctx, heads, layers):  # the layers' K/V of these heads, room for 64 more positions
        shape = (1, heads[1], ctx + 64, heads[2])
        return [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(layers)]
    def run(kv, T, ctx, heads, window=0, sinks=0):
        q = torch.randn(1, T, heads[0], heads[2], generator=g)
        y, seq = torch.empty_like(q), torch.tensor([ctx + T], dtype=torch.int32)
        return y, lambda: [m.attention(y, q, k, v, seq, heads[2] ** -0.5, window, sinks) for k, v in kv]
    for heads in sorted({run[2] for run in ATTENTION_RUNS}):
        for ctx in (77, 300):  # a partial split and block; window + sinks cutting the cache
            kv = caches(ctx, heads, 2)
            for T in CHECK_ROWS:
                for window, sinks in ((0, 0), (40, 4)):
                    y, fn = run(kv, T, ctx, heads, window, sinks)
                    fn()
                    outs.append(y)
    for label, n_threads, heads, layers, ctx in ATTENTION_RUNS:
        torch.set_num_threads(n_threads or threads)
        kv = caches(ctx, heads, layers)
        for T in rows:
            res[f"T{T}|{label.format(threads=n_threads or threads)}|ms"] = 1e3 * best(run(kv, T, ctx, heads)[1])
        del kv
elif kernel == "nucleus":
    torch.set_num_threads(threads)
    for (top_k, top_p) in ((0, 0.9), (40, 1.0)):
        for V in (300, 20000):
            x = torch.randn(max(CHECK_ROWS), V, generator=g) * 4
            for T in CHECK_ROWS:
                y = torch.empty(T, V)
                m.nucleus(y, x[:T], 0.7, top_k, top_p)
                outs.append(y)
        for V in PICK_VOCABS:
            x = torch.randn(max(rows), V, generator=g) * 4
            for T in rows:
                y = torch.empty(T, V)
                label = f"top-p {top_p}" if top_p < 1 else f"top-k {top_k}"
                res[f"T{T}|{label}, {V} tokens, {threads} threads|us"] = 1e6 * best(
                    lambda: m.nucleus(y, x[:T], 0.7, top_k, top_p), 20)
else:
    code = m.formats().index(kernel)
    def panels(o, i):
        return list(W.to_panels(W.quantize(torch.randn(o, i, generator=g) * 0.02, kernel)))
    for o, i in CHECK_SHAPES:
        w = panels(o, i)
        for T in CHECK_ROWS:
            y = torch.empty(T, o)
            m.linear(y, torch.randn(T, i, generator=g), code, w)
            outs.append(y)
    torch.set_num_threads(1)
    o, i = COMPUTE_SHAPE
    w = panels(o, i)
    for T in rows:
        x, y = torch.randn(T, i, generator=g), torch.empty(T, o)
        res[f"T{T}|one thread, {o} x {i} in L2|us"] = 1e6 * best(lambda: m.linear(y, x, code, w), 100)
    o, i = PROLOGUE_SHAPE
    w = panels(o, i)
    for T in rows:
        x, y = torch.randn(T, i, generator=g), torch.empty(T, o)
        res[f"T{T}|one thread, {o} x {i}: one panel, the call's own work|us"] = 1e6 * best(
            lambda: m.linear(y, x, code, w), 1000)
    torch.set_num_threads(threads)
    layer = [(i, panels(o, i)) for o, i in LAYER_SHAPES]
    for T in rows:  # the calls' own costs on the threads (the handoff, another core's activations), weights in cache
        xs = {i: torch.randn(T, i, generator=g) for _, i in LAYER_SHAPES}
        ys = [torch.empty(T, o) for o, _ in LAYER_SHAPES]
        def calls():
            for (i, ts), y in zip(layer, ys):
                m.linear(y, xs[i], code, ts)
        res[f"T{T}|{threads} threads, the default model's layer in cache|us"] = 1e6 * best(calls, 100)
    ws = [(i, panels(o, i)) for _ in range(layers) for o, i in STREAM_SHAPES]
    mb = sum(t.numel() * t.element_size() for _, ts in ws for t in ts) / 1e6
    for T in rows:
        xs = {i: torch.randn(T, i, generator=g) for _, i in STREAM_SHAPES}
        ys = [torch.empty(T, ts[0].shape[0] * 16) for _, ts in ws]
        def step():
            for (i, ts), y in zip(ws, ys):
                m.linear(y, xs[i], code, ts)
        res[f"T{T}|{threads} threads, {mb:.0f} MB from DRAM|ms"] = 1e3 * best(step)
torch.save(outs, out)
print("RESULT " + json.dumps(res))
"""


def child(tree: Path, kernel: str, rows: list[int], args, out: Path) -> dict:
    """CHILD in `tree`, its kernels built where engine.ops.ext keeps them (a folder per hash of the sources)."""
    code = (f"COMPUTE_SHAPE, LAYER_SHAPES, STREAM_SHAPES = {COMPUTE_SHAPE}, {LAYER_SHAPES}, {STREAM_SHAPES}\n"
            f"CHECK_SHAPES, CHECK_ROWS = {CHECK_SHAPES}, {CHECK_ROWS}\n"
            f"ATTENTION_RUNS, PICK_VOCABS = {ATTENTION_RUNS}, {PICK_VOCABS}\n"
            f"PROLOGUE_SHAPE = {PROLOGUE_SHAPE}\n" + CHILD)
    return in_tree(tree, code, [kernel, ",".join(map(str, rows)), str(out), args.isa, str(args.repeats),
                                str(args.threads), str(args.layers)], what="the kernels")


def bench(args) -> dict:
    baseline = Path(args.baseline).resolve()
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="kernels-ab-") as tmp:
        for kernel in args.kernels:
            runs: dict[str, list[dict]] = {"new": [], "baseline": []}
            trees = [("new", HERE), ("baseline", baseline)]
            for r in range(args.rounds):
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    runs[name].append(child(tree, kernel, args.rows, args, Path(tmp) / f"{name}.pt"))
                    print(kernel, r, name, {k: round(v, 2) for k, v in runs[name][-1].items() if k != "isa"},
                          flush=True)
            a, b = torch.load(Path(tmp) / "new.pt"), torch.load(Path(tmp) / "baseline.pt")
            same = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
            for key in runs["new"][0]:
                if "|" not in key:
                    continue
                T, timing, unit = key.split("|")
                new, old = [x[key] for x in runs["new"]], [x[key] for x in runs["baseline"]]
                ratios = [n / o for n, o in zip(new, old, strict=True)]
                rows_out.append(dict(kernel=kernel, isa=runs["new"][0]["isa"], T=int(T[1:]), timing=timing, unit=unit,
                                     new=statistics.median(new), baseline=statistics.median(old),
                                     new_over_baseline=statistics.median(ratios), lo=min(ratios), hi=max(ratios),
                                     bits_equal=same))
            rows_out.append(dict(kernel=kernel, timing="read GB/s (probe)",
                                 new=statistics.median(x["read_gb_s"] for x in runs["new"]),
                                 baseline=statistics.median(x["read_gb_s"] for x in runs["baseline"])))
    return dict(baseline=str(baseline), baseline_label=args.baseline_label, isa=args.isa, rounds=args.rounds,
                repeats=args.repeats, threads=args.threads, layers=args.layers, rows=rows_out)


def markdown(result: dict) -> str:
    head = (f"This tree's CPU kernels against {result['baseline_label']} ({result['baseline']}), fresh "
            f"processes alternating over {result['rounds']} rounds, each figure the minimum of {result['repeats']} "
            "within a process (timing: what was timed). new / baseline: the median of the rounds' own ratios (lo, "
            "hi: the extremes). bits_equal: every output of both trees identical over ragged shapes (attention: and "
            f"windowed caches) and T in {CHECK_ROWS}.\n\n")
    return head + markdown_table(result["rows"], ["kernel", "isa", "T", "timing", "unit", "new", "baseline",
                                                  "new_over_baseline", "lo", "hi", "bits_equal"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a source tree (a worktree of the commit before the change)")
    p.add_argument("--baseline-label", default="the baseline's kernels")
    p.add_argument("--kernels", nargs="+", required=True,
                   help="GEMM weight formats (q4, q4_a8, q4_k, ...), 'attention' and/or 'nucleus'")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 6, 16])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default="", choices=["", "avx2", "avx512", "amx"], help="a kernel path (default: the best)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="kernels-ab-cpu")
    args = p.parse_args(argv)
    result = bench(args)
    result["provenance"] = provenance("cpu")
    md = markdown(result)
    write_results(args.out, args.name, result, md)
    print(md)


if __name__ == "__main__":
    main()
