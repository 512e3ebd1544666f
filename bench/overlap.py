"""Whether a verify pass's GEMMs wait on the weight stream or on the core: one pass's layer GEMMs streamed, the same
work on weights already in cache, and one row streamed, alternating in one process.

    python -m bench.overlap [--formats q4_a8 q4] [--rows 6 16] [--rounds 8] [--name overlap-cpu-<kind>]

The default model's 30 layers (qkv, o, gate_up, down; random weights in the kernels' panels, each layer its own
tensors) through the fused linear on the threads asked for, three ways:
  - stream_T1: one row over all 30 layers, the weights read from memory (a decode step's GEMMs);
  - cached_T: T rows over one layer's four matrices 30 times over, the same calls and block count with the
    weights in the cores' caches (the instructions alone);
  - stream_T: T rows over all 30 layers (a verify pass's GEMMs);
  - cached_T_one_thread: cached_T on one thread, from which a tile's pace, ns per block of 16 outputs x 32 inputs
    and T rows on one core (block_ns_one_thread; block_ns: the same over the threads, per core), to hold against
    bench.ports's floor.
If the tiles' compute and the weight stream overlapped perfectly, stream_T would be max(stream_T1, cached_T)
(over_max 1.0); if not at all, their sum (over_sum 1.0). Each figure is the minimum of `--repeats` within a
round, the runs interleaved (bench.kernels best_of_each, their order rotating a round), and the ratios are each
round's own, then the median over rounds:
the box's bandwidth and the host's load on its cores move within minutes.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import engine  # noqa: F401  (sets OpenMP's passive wait policy before torch loads)
import torch

from bench.common import markdown_table, run_and_save
from bench.kernels import LAYER_SHAPES, LAYERS, best_of_each, random_panels
from engine.observe.bandwidth import measure_gbs
from engine.ops import ext


def layer_calls(m, code: int, layers: list[list[tuple]], T: int, g: torch.Generator):
    """A function running T rows through every matrix of `layers`, in order, as a step's blocks do."""
    xs = {n_in: torch.randn(T, n_in, generator=g) for _, n_in in LAYER_SHAPES}
    ys = {out: torch.empty(T, out) for out, _ in LAYER_SHAPES}

    def run():
        for layer in layers:
            for (out, n_in), panels in zip(LAYER_SHAPES, layer, strict=True):
                m.linear(ys[out], xs[n_in], code, panels)
    return run


def one_thread(run):
    """run on one thread, the thread count put back after."""
    def wrapped():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            run()
        finally:
            torch.set_num_threads(threads)
    return wrapped


def blocks_per_pass() -> int:
    """Blocks of 16 outputs x 32 inputs in the 30 layers' GEMMs."""
    return LAYERS * sum(-(-out // 16) * -(-n_in // 32) for out, n_in in LAYER_SHAPES)


def summarize(fmt: str, T: int, rounds: list[dict], threads: int = 2) -> dict:
    """Medians over rounds of each timing and of each round's own ratios."""
    med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
    over_max = [r["stream_T"] / max(r["stream_T1"], r["cached_T"]) for r in rounds]
    over_sum = [r["stream_T"] / (r["stream_T1"] + r["cached_T"]) for r in rounds]
    return dict(format=fmt, T=T, stream_T1_ms=med("stream_T1"), cached_T_ms=med("cached_T"),
                stream_T_ms=med("stream_T"), cached_over_stream_T1=statistics.median(
                    r["cached_T"] / r["stream_T1"] for r in rounds),
                over_max=statistics.median(over_max), over_max_lo=min(over_max), over_max_hi=max(over_max),
                over_sum=statistics.median(over_sum), read_gb_s=med("read_gb_s"),
                block_ns=1e6 * med("cached_T") * threads / blocks_per_pass(),
                block_ns_one_thread=1e6 * med("cached_T_one_thread") / blocks_per_pass())


def bench(args, save) -> dict:
    m = ext.load("cpu").module
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    out = dict(threads=args.threads, rounds=args.rounds, repeats=args.repeats, layers=LAYERS, isa=m.isa(),
               rows=[], raw=[])
    for fmt in args.formats:
        code = m.formats().index(fmt)
        layers = [[random_panels(fmt, o, i, g) for o, i in LAYER_SHAPES] for _ in range(LAYERS)]
        mb = sum(t.numel() * t.element_size() for layer in layers for p in layer for t in p) / 1e6
        for T in args.rows:
            runs = {"stream_T1": layer_calls(m, code, layers, 1, g),
                    "cached_T": layer_calls(m, code, [layers[0]] * LAYERS, T, g),
                    "stream_T": layer_calls(m, code, layers, T, g)}
            runs["cached_T_one_thread"] = one_thread(runs["cached_T"])
            names = list(runs)
            rounds = []
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]  # the order rotates one place a round
                best = best_of_each({name: runs[name] for name in order}, args.repeats)
                rounds.append(dict(read_gb_s=measure_gbs("cpu"), **{name: 1e3 * s for name, s in best.items()}))
            row = summarize(fmt, T, rounds, args.threads)
            row["weight_mb"] = mb
            out["rows"].append(row)
            out["raw"].append(dict(format=fmt, T=T, rounds=rounds))
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
            save(out)
    return out


def markdown(result: dict) -> str:
    return (f"A verify pass's layer GEMMs (the default model's 30 layers, random weights) on {result['threads']} "
            f"threads, {result['isa']}: stream_T1 one row from memory, cached_T T rows over one layer's matrices "
            f"30 times (in cache: the instructions alone), stream_T T rows from memory; each the minimum of "
            f"{result['repeats']} within a round (the runs interleaved), {result['rounds']} rounds, the order "
            "rotating. over_max = "
            "stream_T / max(stream_T1, cached_T): 1.0 where the tiles' work and the weight stream overlap fully; "
            "over_sum = stream_T / (stream_T1 + cached_T): 1.0 where they do not overlap at all (medians of each "
            "round's own ratio; lo / hi the extremes). cached_over_stream_T1 > 1: the T-row tiles take longer "
            "than one row's weights take to stream, so the pass waits on the core. block_ns: cached_T per block of "
            "16 outputs x 32 inputs and T rows on each core; block_ns_one_thread: the same run on one thread.\n\n"
            + markdown_table(result["rows"], ["format", "T", "weight_mb", "read_gb_s", "stream_T1_ms", "cached_T_ms",
                                              "stream_T_ms", "cached_over_stream_T1", "over_max", "over_max_lo",
                                              "over_max_hi", "over_sum", "block_ns", "block_ns_one_thread"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=["q4_a8", "q4"])
    p.add_argument("--rows", type=int, nargs="+", default=[6, 16])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="overlap-cpu")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
