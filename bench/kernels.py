"""The CPU kernels alone: one decode step's GEMMs per weight format, and attention over the cache.

    python -m bench.kernels [--out bench/results] [--threads 2] [--repeats 7] [--paths avx2 avx512 amx]
    python -m bench.kernels --alternate q4 q4_k q5_k q6_k [--layers 3]   (formats against one another)

GEMMs: the default model's shapes (30 layers of qkv 576->960, o 576->576, gate_up 576->3072, down
1536->576, then the tied head 576->49152), random weights already in the kernels' panel layout, every
layer its own tensors so a step streams all of them from DRAM as a real one does. Timed on every kernel path
the CPU runs (avx2, avx512, amx), the paths interleaved, at T = 1 (decode), 6 (a verify pass), 16 and 128
(prefill) rows; ms is the minimum over repeats of a whole step, GB/s the
weight bytes over that time, % of the read bandwidth measured in this run (engine/observe/bandwidth.py).
Attention: 9 query / 3 kv heads of dim 64 over 30 layers' caches at a few contexts, full and with a
window of 512 + 4 sinks. The machine's load average is recorded before and after: timings from a busy
machine are slower, never faster, so minimums over repeats are the figure to trust.

--alternate times the formats named against one another in one interleaved group, on the best path (or the
first of --paths this CPU runs): a few layers of Qwen2.5-1.5B's shapes (hidden 1536, intermediate 8960: every
input a whole number of the K-quants' super-blocks of 256, as in the GGUF files that ship them), written to
kernels-formats-cpu.* (--name: another name, one per CPU kind).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import engine  # noqa: F401  (sets OpenMP's passive wait policy before torch loads)
import torch

from bench.common import markdown_table, provenance, write_results
from engine.ops import ext
from engine.observe.bandwidth import measure_gbs
from engine import weights as W
from engine.ops import ref

HIDDEN, INTER, LAYERS, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 30, 49152, 9, 3, 64
LAYER_SHAPES = [(3 * 320, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # (out, in)
FORMATS = W.PANEL_FORMATS  # every format with a CPU kernel; q8 = Q8_0 as a q4 model's head (16-bit activations)


def random_panels(fmt: str, out: int, n_in: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random weights packed as engine.weights packs them for the CPU kernels (the values do not change the time)."""
    return W.to_panels(W.quantize(torch.randn(out, n_in, generator=g) * 0.02, fmt))


def step_weights(fmt: str, g: torch.Generator) -> list[tuple[int, int, tuple]]:
    shapes = [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [(VOCAB, HIDDEN)]
    return [(out, n_in, random_panels(fmt, out, n_in, g)) for out, n_in in shapes]


def cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks of all CPUs, ticks of this process, all ticks) from /proc, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        with open("/proc/self/stat") as f:
            mine = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return v[0] + v[1] + v[2] + v[5] + v[6], int(mine[11]) + int(mine[12]), sum(v)


OTHERS: list[float] = []  # per timed group: the share of the CPUs other processes used meanwhile


def others_pct() -> float | None:
    return round(100 * OTHERS[-1], 1) if OTHERS else None


class ReadProbe:
    """engine/observe/bandwidth.py's measure: a read-only reduction over 512 MB, as a callable to time."""

    def __init__(self, nbytes: int = 512 * 2**20):
        self.x, self.nbytes = torch.ones(nbytes // 4), nbytes

    def __call__(self):
        self.x.sum()


def best_of_each(fns: dict, repeats: int, setup=None) -> dict:
    """Minimum seconds of each fn over `repeats` rounds (a busy machine only ever makes a call slower).
    The fns run interleaved, round by round, so that all of them see the same machine: this box's memory
    bandwidth drifts by a third within a minute, and a ratio of two timings taken a minute apart says more
    about the drift than about the kernels. setup() runs untimed before each call. Records how much of the
    CPUs other processes took meanwhile."""
    for fn in fns.values():
        fn()  # warm-up: page faults, the pool's threads, scratch buffers
    before = cpu_ticks()
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            if setup is not None:
                setup()
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    after = cpu_ticks()
    if before and after and after[2] > before[2]:
        # ticks are 10 ms, so a short window reads a few percent either way; below zero is noise
        OTHERS.append(max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / (after[2] - before[2])))
    return best


# name -> (set_isa's argument, the AMX crossover in rows: None keeps the module's)
PATHS = {"avx2": ("avx2", None), "avx512": ("avx512", None), "amx": ("amx", None), "amx tiles": ("amx", 1)}


def available_paths(m, names: list[str]) -> list[str]:
    best, ok = m.isa().split()[0], []
    for name in names:
        try:
            m.set_isa(PATHS[name][0])
            ok.append(name)
        except RuntimeError as e:
            print(f"skipping {name}: {e}", flush=True)
    m.set_isa(best)
    return ok


def bench_gemm(m, fmt: str, rows_list: list[int], repeats: int, probe: ReadProbe, paths: list[str]) -> list[dict]:
    """One decode step's GEMMs at each row count on each path, the paths interleaved round by round."""
    g = torch.Generator().manual_seed(0)
    weights = step_weights(fmt, g)
    nbytes = sum(t.numel() * t.element_size() for _, _, ts in weights for t in ts)
    code = m.formats().index(fmt)
    best_isa, crossover = m.isa().split()[0], m.amx_rows()

    def step_for(T: int, path: str):
        xs = {n_in: torch.randn(T, n_in, generator=g) for n_in in (HIDDEN, INTER)}
        outs = [torch.empty(T, out) for out, _, _ in weights]
        isa, rows = PATHS[path]

        def step():
            m.set_isa(isa)
            m.set_amx_rows(rows or crossover)
            for (_, n_in, ts), y in zip(weights, outs, strict=True):
                m.linear(y, xs[n_in], code, list(ts))
        return step

    try:
        best = best_of_each({"read": probe, **{(p, T): step_for(T, p) for p in paths for T in rows_list}}, repeats)
    finally:
        m.set_isa(best_isa)
        m.set_amx_rows(crossover)
    bw, others = probe.nbytes / best["read"] / 1e9, others_pct()
    return [dict(op="gemm step", format=fmt, path=p, T=T, ms=best[p, T] * 1e3, gb_s=nbytes / best[p, T] / 1e9,
                 pct_of_read_bw=100 * nbytes / best[p, T] / 1e9 / bw, ratio_vs_T1=best[p, T] / best[p, rows_list[0]],
                 weight_mb=nbytes / 1e6, read_gb_s=bw, others_pct=others) for p in paths for T in rows_list]


QWEN_1_5B = [(2048, 1536), (1536, 1536), (2 * 8960, 1536), (1536, 8960)]  # qkv, o, gate_up, down (out, in)


def bench_alternating(m, formats: list[str], layers: int, rows_list: list[int], repeats: int,
                      probe: ReadProbe) -> list[dict]:
    """The formats' steps of `layers` Qwen2.5-1.5B layers on the best path, every format and T timed in one
    interleaved group, so a ratio between two formats is not the box's drift between two groups."""
    g = torch.Generator().manual_seed(3)
    steps, nbytes = {}, {}
    for fmt in formats:
        weights = [(n_in, random_panels(fmt, out, n_in, g)) for _ in range(layers) for out, n_in in QWEN_1_5B]
        nbytes[fmt] = sum(t.numel() * t.element_size() for _, ts in weights for t in ts)
        code = m.formats().index(fmt)
        for T in rows_list:
            xs = {n_in: torch.randn(T, n_in, generator=g) for n_in in (1536, 8960)}
            outs = [torch.empty(T, ts[0].shape[0] * 16) for _, ts in weights]

            def step(weights=weights, code=code, xs=xs, outs=outs):
                for (n_in, ts), y in zip(weights, outs, strict=True):
                    m.linear(y, xs[n_in], code, list(ts))
            steps[fmt, T] = step
    best = best_of_each({"read": probe, **steps}, repeats)
    bw, others = probe.nbytes / best["read"] / 1e9, others_pct()
    base = formats[0]
    return [dict(op="gemm formats", format=f, path=m.isa(), T=T, ms=best[f, T] * 1e3, gb_s=nbytes[f] / best[f, T] / 1e9,
                 pct_of_read_bw=100 * nbytes[f] / best[f, T] / 1e9 / bw, weight_mb=nbytes[f] / 1e6,
                 gb_s_vs_first=(nbytes[f] / best[f, T]) / (nbytes[base] / best[base, T]), read_gb_s=bw,
                 others_pct=others) for f in formats for T in rows_list]


def bench_torch_f32(rows_list: list[int], repeats: int, probe: ReadProbe) -> list[dict]:
    """The same step through torch (MKL) on fp32 weights stored [in, out], the layout engine/model.py uses."""
    g = torch.Generator().manual_seed(1)
    shapes = [s for _ in range(LAYERS) for s in LAYER_SHAPES] + [(VOCAB, HIDDEN)]
    ws = [torch.randn(n_in, out, generator=g) for out, n_in in shapes]
    nbytes = sum(w.numel() * 4 for w in ws)
    xs = {T: {n_in: torch.randn(T, n_in, generator=g) for n_in in (HIDDEN, INTER)} for T in rows_list}
    fns = {T: (lambda x=xs[T]: [x[w.shape[0]] @ w for w in ws]) for T in rows_list}
    best = best_of_each({"read": probe, **fns}, repeats)
    bw, others = probe.nbytes / best["read"] / 1e9, others_pct()
    return [dict(op="gemm step", format="torch f32", T=T, ms=best[T] * 1e3, gb_s=nbytes / best[T] / 1e9,
                 pct_of_read_bw=100 * nbytes / best[T] / 1e9 / bw, weight_mb=nbytes / 1e6, read_gb_s=bw,
                 others_pct=others) for T in rows_list]


def bench_attention(m, contexts: list[int], repeats: int, probe: ReadProbe) -> list[dict]:
    g = torch.Generator().manual_seed(2)
    rows = []
    cases = [(T, window, sinks) for T in (1, 6) for window, sinks in ((0, 0), (512, 4))]
    evict = torch.ones(64 * 2**20 // 4)
    flush = evict.sum
    for ctx in contexts:
        shape = (1, KV_HEADS, ctx + 64, HEAD_DIM)
        caches = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(LAYERS)]
        seq = torch.tensor([ctx], dtype=torch.int32)
        qs = {T: torch.randn(1, T, HEADS, HEAD_DIM, generator=g) for T in (1, 6)}
        out = {T: torch.empty_like(q) for T, q in qs.items()}

        def step_for(T: int, window: int, sinks: int, caches=caches, qs=qs, out=out, seq=seq):
            def step():
                for k, v in caches:
                    m.attention(out[T], qs[T], k, v, seq, HEAD_DIM ** -0.5, window, sinks)
            return step

        # In a real step the layer's weights stream between two attention calls and evict the cache, so
        # the timed step starts from DRAM too, even where 30 layers' K/V would fit the 32 MB L3.
        best = best_of_each({"read": probe, **{c: step_for(*c) for c in cases}}, repeats, setup=flush)
        bw, others = probe.nbytes / best["read"] / 1e9, others_pct()
        k, v = caches[0]
        twin = best_of_each({c: (lambda c=c, q=qs, k=k, v=v, seq=seq: ref.attention(
            q[c[0]], k, v, seq, HEAD_DIM ** -0.5, c[1], c[2])) for c in cases}, 3)
        for T, window, sinks in cases:
            live = ctx if window == 0 else min(ctx, sinks + window + T - 1)
            nbytes = LAYERS * 2 * KV_HEADS * live * HEAD_DIM * 4
            s = best[T, window, sinks]
            rows.append(dict(op="attention step", context=ctx, T=T, window=window, sinks=sinks, ms=s * 1e3,
                             gb_s=nbytes / s / 1e9, pct_of_read_bw=100 * nbytes / s / 1e9 / bw, read_gb_s=bw,
                             twin_ms=twin[T, window, sinks] * LAYERS * 1e3, others_pct=others))
        del caches
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 6, 16, 128])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--contexts", type=int, nargs="*", default=[256, 1024, 4096, 8192])
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS),
                   help="the paths to time the GEMMs on (attention runs on the best); 'amx tiles': AMX at every T")
    p.add_argument("--alternate", nargs="+", choices=FORMATS, help="time these formats against one another only")
    p.add_argument("--layers", type=int, default=3, help="--alternate: Qwen2.5-1.5B layers per step")
    p.add_argument("--name", default="kernels-formats-cpu",
                   help="--alternate: the results' file name (one per CPU kind, e.g. kernels-formats-cpu-avx2)")
    args = p.parse_args(argv)
    status = ext.load("cpu")
    if status.module is None:
        sys.exit(f"the CPU kernels are not available, nothing to time: {status.reason}")
    m = status.module
    if args.alternate:
        if args.paths != list(PATHS):  # --paths named: the first of them this CPU runs, else the best path
            m.set_isa(PATHS[available_paths(m, args.paths)[0]][0])
        torch.set_num_threads(args.threads)
        load_before = os.getloadavg()
        rows = bench_alternating(m, args.alternate, args.layers, args.rows, args.repeats, ReadProbe())
        result = dict(isa=m.isa(), threads=args.threads, load_before=load_before, load_after=os.getloadavg(),
                      rows=rows, provenance=provenance("cpu"))
        md = (f"{args.layers} layers of Qwen2.5-1.5B's GEMMs per step, the formats interleaved round by round on "
              f"{m.isa()}, {args.threads} threads, minimum over {args.repeats} repeats; load average before "
              f"{load_before[0]:.2f}, after {result['load_after'][0]:.2f}:\n\n") + markdown_table(
            rows, ["format", "T", "ms", "weight_mb", "gb_s", "gb_s_vs_first", "pct_of_read_bw", "read_gb_s",
                   "others_pct"])
        write_results(args.out, args.name, result, md)
        print(md)
        return
    paths = available_paths(m, args.paths)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    bw = measure_gbs("cpu")
    probe = ReadProbe()
    rows = []
    cols = ["format", "path", "T", "ms", "gb_s", "pct_of_read_bw", "ratio_vs_T1", "read_gb_s", "others_pct"]
    for fmt in args.formats:
        rows += bench_gemm(m, fmt, args.rows, args.repeats, probe, paths)
        print(markdown_table(rows[-len(args.rows) * len(paths):], cols))
    rows += bench_torch_f32([1, 6], args.repeats, probe)
    attn = bench_attention(m, args.contexts, args.repeats, probe) if args.contexts else []
    others = 100 * max(OTHERS) if OTHERS else None
    result = dict(isa=m.isa(), paths=paths, threads=args.threads, read_bandwidth_gb_s=bw, load_before=load_before,
                  load_after=os.getloadavg(), other_processes_max_cpu_pct=others, rows=rows + attn,
                  provenance=provenance("cpu"))
    quiet = "" if others is None else (f" Other processes took up to {others:.0f}% of the CPUs while a group was "
                                       "timed (others_pct).")
    head = (f"CPU kernels, GEMMs on each path ({', '.join(paths)}; 'amx' runs its tiles from T >= {m.amx_rows()}, "
            f"'amx tiles' at every T), attention on {m.isa()}; {args.threads} threads, minimum over {args.repeats} "
            "repeats. Read bandwidth "
            f"at the start of the run (engine/observe/bandwidth.py): {bw:.1f} GB/s; read_gb_s is the same measure "
            "interleaved with each group's timings, which pct_of_read_bw divides by. Load average before "
            f"{load_before[0]:.2f}, after {result['load_after'][0]:.2f}.{quiet}\n\nOne decode step's GEMMs "
            "(30 layers + head), random weights:\n\n")
    md = head + markdown_table(rows, cols[:6] + ["weight_mb"] + cols[6:])
    if attn:
        md += ("\nAttention, 9/3 heads of dim 64, 30 layers (ms per step, caches flushed before each step as the "
               "weights flush them in a real one; gb_s counts the live K/V bytes):\n\n") + markdown_table(
            attn, ["context", "T", "window", "sinks", "ms", "gb_s", "pct_of_read_bw", "twin_ms", "others_pct"])
    write_results(args.out, "kernels-cpu", result, md)
    print(md)


if __name__ == "__main__":
    main()
