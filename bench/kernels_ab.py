"""Two source trees' CPU GEMM kernels against each other: a kernel change and the commit before it.

    python -m bench.kernels_ab --baseline /tmp/before --formats q4_a8 --rows 1 6 16 --name kernels-ab-<change>

Each round runs this tree's kernels and the baseline's in fresh processes, one after the other (the order turned
every round), since two builds of the extension cannot share a process. Every process times the same random
weights (one seed), two ways:
  - compute: one thread, a 1536 x 576 matrix resident in L2, T rows: what a verify pass's tiles cost when the
    weights are already there (the instructions, not the memory; this CPU's clock moves it little);
  - stream: the threads asked for (2), 3 layers of Qwen2.5-1.5B's four GEMMs from DRAM, as bench.kernels
    --alternate times them: the box's bandwidth moves it (the read probe of each process is recorded).
Each figure is the minimum over `--repeats` within a process; the table gives the median over rounds for each
tree and the median of the rounds' own new / baseline ratios. The outputs of both trees are compared bit for bit
(a kernel change that moves the bits is a numerics change, not a speed-up: the run says so).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import markdown_table, provenance, write_results

HERE = Path(__file__).resolve().parents[1]
COMPUTE_SHAPE = (1536, 576)  # (out, in): 96 panels x 18 blocks of q4, ~0.55 MB, inside a 1 MB L2
STREAM_SHAPES = [(2048, 1536), (1536, 1536), (2 * 8960, 1536), (1536, 8960)]  # Qwen2.5-1.5B: qkv, o, gate_up, down
CHECK_SHAPES = [(960, 576), (1536, 8960), (100, 1000)]  # ragged ones too: a partial panel, a partial block
CHECK_ROWS = (1, 3, 6, 9, 16)

# One process of one tree: times, and the outputs for the bits check. Run with that tree first on sys.path.
CHILD = r"""
import json, sys, time
import engine  # noqa: F401  (OpenMP's wait policy before torch loads)
import torch
from engine.ops import ext
from engine import weights as W
from engine.observe.bandwidth import measure_gbs
fmt, rows, out, isa = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3], sys.argv[4]
repeats, threads, layers = (int(a) for a in sys.argv[5:8])
m = ext.load("cpu").module
if isa:
    m.set_isa(isa)
code = m.formats().index(fmt)
g = torch.Generator().manual_seed(0)
def panels(o, i):
    return list(W.to_panels(W.quantize(torch.randn(o, i, generator=g) * 0.02, fmt)))
def best(fn):
    fn()
    b = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
    return b
outs = []
for o, i in CHECK_SHAPES:
    w = panels(o, i)
    for T in CHECK_ROWS:
        y = torch.empty(T, o)
        m.linear(y, torch.randn(T, i, generator=g), code, w)
        outs.append(y)
torch.save(outs, out)
res = dict(isa=m.isa())
torch.set_num_threads(1)
o, i = COMPUTE_SHAPE
w = panels(o, i)
for T in rows:
    x, y = torch.randn(T, i, generator=g), torch.empty(T, o)
    res[f"compute_us_T{T}"] = 1e6 * best(lambda: [m.linear(y, x, code, w) for _ in range(100)]) / 100
torch.set_num_threads(threads)
ws = [(i, panels(o, i)) for _ in range(layers) for o, i in STREAM_SHAPES]
res["stream_mb"] = sum(t.numel() * t.element_size() for _, ts in ws for t in ts) / 1e6
res["read_gb_s"] = measure_gbs("cpu")
for T in rows:
    xs = {i: torch.randn(T, i, generator=g) for _, i in STREAM_SHAPES}
    ys = [torch.empty(T, ts[0].shape[0] * 16) for _, ts in ws]
    def step():
        for (i, ts), y in zip(ws, ys):
            m.linear(y, xs[i], code, ts)
    res[f"stream_ms_T{T}"] = 1e3 * best(step)
print("RESULT " + json.dumps(res))
"""


def child(tree: Path, fmt: str, rows: list[int], args, out: Path) -> dict:
    """CHILD in `tree`, its kernels built where engine.ops.ext keeps them (a folder per hash of the sources)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    code = (f"COMPUTE_SHAPE, STREAM_SHAPES, CHECK_SHAPES, CHECK_ROWS = {COMPUTE_SHAPE}, {STREAM_SHAPES}, "
            f"{CHECK_SHAPES}, {CHECK_ROWS}\n" + CHILD)
    done = subprocess.run([sys.executable, "-c", code, fmt, ",".join(map(str, rows)), str(out), args.isa,
                           str(args.repeats), str(args.threads), str(args.layers)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"the kernels of {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def bench(args) -> dict:
    baseline = Path(args.baseline).resolve()
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="kernels-ab-") as tmp:
        for fmt in args.formats:
            runs: dict[str, list[dict]] = {"new": [], "baseline": []}
            trees = [("new", HERE), ("baseline", baseline)]
            for r in range(args.rounds):
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    runs[name].append(child(tree, fmt, args.rows, args, Path(tmp) / f"{name}.pt"))
                    print(fmt, r, name, {k: round(v, 2) for k, v in runs[name][-1].items() if k != "isa"},
                          flush=True)
            a, b = torch.load(Path(tmp) / "new.pt"), torch.load(Path(tmp) / "baseline.pt")
            same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
            for T in args.rows:
                for kind, unit in (("compute", "us"), ("stream", "ms")):
                    key = f"{kind}_{unit}_T{T}"
                    new = [x[key] for x in runs["new"]]
                    old = [x[key] for x in runs["baseline"]]
                    ratios = [n / o for n, o in zip(new, old, strict=True)]
                    rows_out.append(dict(format=fmt, isa=runs["new"][0]["isa"], T=T, timing=kind, unit=unit,
                                         new=statistics.median(new), baseline=statistics.median(old),
                                         new_over_baseline=statistics.median(ratios), lo=min(ratios),
                                         hi=max(ratios), bits_equal=same))
            rows_out.append(dict(format=fmt, timing="read GB/s (probe)",
                                 new=statistics.median(x["read_gb_s"] for x in runs["new"]),
                                 baseline=statistics.median(x["read_gb_s"] for x in runs["baseline"])))
    return dict(baseline=str(baseline), baseline_label=args.baseline_label, isa=args.isa, rounds=args.rounds,
                repeats=args.repeats, threads=args.threads, layers=args.layers, rows=rows_out)


def markdown(result: dict) -> str:
    head = (f"This tree's CPU GEMM kernels against {result['baseline_label']} ({result['baseline']}), fresh "
            f"processes alternating over {result['rounds']} rounds, each figure the minimum of "
            f"{result['repeats']} within a process. compute: one thread, a {COMPUTE_SHAPE[0]} x {COMPUTE_SHAPE[1]} "
            f"matrix in L2 (us a call); stream: {result['threads']} threads, {result['layers']} layers of "
            "Qwen2.5-1.5B's GEMMs from DRAM (ms a pass). new / baseline: the median of the rounds' own ratios "
            "(lo, hi: the extremes). bits_equal: every output of both trees identical over ragged shapes and "
            f"T in {CHECK_ROWS}.\n\n")
    return head + markdown_table(result["rows"], ["format", "isa", "T", "timing", "unit", "new", "baseline",
                                                  "new_over_baseline", "lo", "hi", "bits_equal"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a source tree (a worktree of the commit before the change)")
    p.add_argument("--baseline-label", default="the baseline's kernels")
    p.add_argument("--formats", nargs="+", required=True)
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
