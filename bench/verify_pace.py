"""A verify pass's cost over a decode step, against how fast the vCPUs ran at the moment it was timed.

    python -m bench.verify_pace [--weights q4_a8] [--rows 6 16] [--samples 80] [--name verify-pace-cpu-<kind>]

On a virtual machine a vCPU's pace moves with the host's other work (bench.vcpus: the same compute-only sweep ran
1.3-1.9x slower for seconds at a time, each vCPU on its own), and it weighs on a verify pass, whose tiles are
compute, more than on a decode step, which waits on memory. Each sample here: bench.vcpus's pinned probe (the 6-row
q4_a8 tile over a matrix in L2, a fresh process per CPU) on every CPU, a step and a verify pass of each T through
eng.chunk on the default model after a 128-token prompt (each the median of --repeats calls, rolled back after
each, after one untimed call), then the probes again. vT = verify(T) / step within the sample. A sample is at full
pace when all its probes, before and after, lie within 15% of the fastest probe of the run; contended when one lies
1.3x or more above it. Reported: the median vT over all samples, over the full-pace ones and over the contended
ones, with their counts (the rest lie between). Needs an x86-64 CPU with AVX-512 VNNI, g++ and the CPU kernels.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
import torch

from bench import tile_pace, vcpus
from bench.common import markdown_table, run_and_save
from bench.steps import TEXT, greedy_ids, sync

FULL, CONTENDED = 1.15, 1.3  # a probe's time over the run's fastest probe


def probe(exe: Path, cpus: list[int]) -> dict[int, float]:
    """Each CPU's pace now: the pinned driver's ns a block, one CPU after the other."""
    return {cpu: float(vcpus.pinned(exe, cpu, 1).communicate()[0]) for cpu in cpus}


@torch.inference_mode()
def chunk_ms(eng, tokens: torch.Tensor, prompt_len: int, repeats: int) -> float:
    """Median ms of eng.chunk over `tokens` (with the greedy read-back), rolled back after each; one untimed first."""
    times = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        sync(greedy_ids(eng, eng.chunk(tokens)[0]))
        if i:
            times.append((time.perf_counter() - t) * 1e3)
        eng.rollback(prompt_len)
    return statistics.median(times)


def classify(samples: list[dict]) -> None:
    """Mark each sample full-pace or contended against the run's fastest probe."""
    fastest = min(v for s in samples for p in (s["before"], s["after"]) for v in p.values())
    for s in samples:
        worst = max(v for p in (s["before"], s["after"]) for v in p.values()) / fastest
        s["worst_over_fastest"] = worst
        s["pace"] = "full" if worst <= FULL else "contended" if worst >= CONTENDED else "between"


def median_or_none(v: list[float]) -> float | None:
    return statistics.median(v) if v else None


def summarize(samples: list[dict], rows: list[int]) -> list[dict]:
    """Per T: vT's median over all samples, the full-pace ones and the contended ones, and the step's time in each."""
    kinds = (("all", lambda s: True), ("full", lambda s: s["pace"] == "full"),
             ("contended", lambda s: s["pace"] == "contended"))
    out = []
    for T in rows:
        row = dict(T=T)
        for label, keep in kinds:
            kept = [s for s in samples if keep(s)]
            row[f"n_{label}"] = len(kept)
            row[f"v_{label}"] = median_or_none([s[f"v{T}"] for s in kept])
            row[f"step_ms_{label}"] = median_or_none([s["step_ms"] for s in kept])
        out.append(row)
    return out


def bench(args) -> dict:
    from engine import Engine, Tokenizer, load_model

    torch.set_num_threads(args.threads)
    model = load_model(None, weights=args.weights, progress=lambda msg: None)
    eng = Engine(model, max_seq_len=args.prompt_len + 64)
    prompt = Tokenizer(model.path).encode(TEXT.read_text())[: args.prompt_len]
    eng.prefill(prompt)
    tokens = {T: torch.tensor([prompt[:T]]) for T in [1, *args.rows]}
    cpus = sorted(os.sched_getaffinity(0))
    samples = []
    with tempfile.TemporaryDirectory(prefix="verify-pace-") as tmp:
        exe = tile_pace.build(Path(tmp))
        for i in range(args.samples):
            s = dict(before=probe(exe, cpus))
            order = [1, *args.rows] if i % 2 == 0 else [*args.rows, 1]  # the step first, then last
            ms = {T: chunk_ms(eng, tokens[T], len(prompt), args.repeats) for T in order}
            s.update(after=probe(exe, cpus), step_ms=ms[1], **{f"verify{T}_ms": ms[T] for T in args.rows},
                     **{f"v{T}": ms[T] / ms[1] for T in args.rows})
            samples.append(s)
            if i % 10 == 0:
                print(i, {k: round(v, 2) if isinstance(v, float) else v for k, v in s.items()}, flush=True)
    classify(samples)
    return dict(weights=args.weights, rows=summarize(samples, args.rows), samples=samples, threads=args.threads,
                repeats=args.repeats, prompt_len=args.prompt_len, full_within=FULL, contended_from=CONTENDED)


def markdown(result: dict) -> str:
    n = len(result["samples"])
    head = (f"Verify passes over a step ({result['weights']}, the default model after a {result['prompt_len']}-token "
            f"prompt, {result['threads']} threads), {n} samples, each the median of {result['repeats']} calls "
            f"between two probes of every vCPU's pace (bench.vcpus's pinned tile sweep). Full pace: every probe "
            f"within {result['full_within']}x of the run's fastest; contended: one at {result['contended_from']}x or "
            f"more.\n\n")
    cols = ["T", "n_all", "v_all", "n_full", "v_full", "n_contended", "v_contended", "step_ms_full",
            "step_ms_contended"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", default="q4_a8")
    p.add_argument("--rows", type=int, nargs="+", default=[6, 16], help="the verify passes' T")
    p.add_argument("--samples", type=int, default=80)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="verify-pace-cpu")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args), markdown)


if __name__ == "__main__":
    main()
