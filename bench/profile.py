"""Inside a decode step: engine.profile's breakdown (per layer and op class, bytes moved, GB/s against the
bandwidth measured in the same run) for eager vs CUDA graph and torch vs fused kernels, on the embedded
default model, for each weight format asked for.

    python -m bench.profile --device cpu                        # torch vs fused, fp32 and q4
    python -m bench.profile --device cuda --out "$OUT"          # eager/graph x torch/fused, bf16 and q4
    python -m bench.profile --device cpu --weights fp32 fp16 --trace-dir /tmp/traces
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import Telemetry, markdown_table, provenance, write_results
from bench.steps import shape_config
from engine import Engine, load_model
from engine.observe import profile
from engine.checkpoint import random_model
from engine.observe.bandwidth import measure_gbs
from engine.observe.breakdown import OP_CLASSES
from engine.weights import FORMATS
import torch

MODEL = "SmolLM2-135M-Instruct (embedded default)"


def configs(device: str, formats: list[str]) -> list[profile.Config]:
    """CPU: torch vs fused. CUDA: eager vs graph x torch vs fused. Each for every weight format."""
    graphs = (False,) if device == "cpu" else (False, True)
    runners = [(g, f) for f in (False, True) for g in graphs]
    return [profile.Config(f"{'graph' if g else 'eager'} · {'fused' if f else 'torch'} · {w}", fused=f, graphs=g,
                           weights=w) for w in formats for g, f in runners]


def engines(device: str, formats: list[str], max_seq_len: int, notes: list[str]) -> dict:
    """weight format -> Engine on the default model, or on random weights of its shape where the model
    cannot be had (an offline GPU machine: the notes say so)."""
    out = {}
    for fmt in formats:
        try:
            model = load_model(None, device=device, weights=fmt, progress=lambda msg: None)
        except ValueError as e:  # the default model could not be fetched
            notes.append(f"{fmt}: default model unavailable ({str(e).splitlines()[0]}); random weights of its shape")
            model = random_model(shape_config("default"), device, weights=fmt)
        out[fmt] = Engine(model, max_seq_len=max_seq_len)
    return out


def class_rows(results: list) -> list[dict]:
    """Per op class, the decode step summed over layers, one column pair per configuration that ran."""
    rows = []
    for cls in OP_CLASSES:
        row = dict(op_class=cls)
        for r in results:
            if r.reason is None:
                sel = [x for x in r.rows if x["pass"] == "decode" and x["op_class"] == cls]
                ms, nbytes = sum(x["ms"] for x in sel), sum(x["bytes"] for x in sel)
                row[f"{r.config.label} ms"] = ms
                row[f"{r.config.label} GB/s"] = nbytes / ms / 1e6 if ms and nbytes else None
        rows.append(row)
    return rows


def markdown(result: dict, results: list) -> str:
    ran = [r for r in results if r.reason is None]
    head = (f"Inside a decode step on {result['device']}: {result['model']}, batch 1, {result['context']}-token "
            f"context, {result['steps']} decode steps and one verify pass of k + 1 = {result['k'] + 1} tokens per "
            f"configuration, torch.profiler; ms per step are the mean of the quieter half of the steps. Bandwidth "
            f"measured in this run: {result['bandwidth_gbs']:.1f} GB/s. `rows_vs_step` is what the op classes add "
            "up to over the step timed without the profiler (goal: within 10 %); the difference is the profiler's "
            "own cost. Not covered: the work between steps (building the Round and the next token tensor), and the "
            "drafter in speculative modes.\n\n")
    cols = ["configuration", "pass", "step_ms", "profiled_ms", "rows_vs_step", "profiler_overhead_pct"]
    cols += (["host_ms", "device_ms", "idle_ms"] if result["device"] == "cuda" else ["python", "dispatch", "kernel"])
    cols += ["gbs", "total_s"]
    md = head + markdown_table([s for r in ran for s in r.summary], cols)
    class_cols = ["op_class"] + [f"{r.config.label} {x}" for r in ran for x in ("ms", "GB/s")]
    md += "\nDecode step by op class (ms per step, GB/s achieved):\n\n"
    md += markdown_table(class_rows(results), class_cols)
    skipped = [f"- {r.config.label}: {r.reason}" for r in results if r.reason]
    notes = [f"- {n}" for n in result["notes"]]
    if skipped or notes:
        md += "\nNot run here, and notes:\n\n" + "\n".join(skipped + notes) + "\n"
    return md


def main(argv=None):
    p = argparse.ArgumentParser(description="profile of a decode step per layer and op class")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--weights", nargs="+", default=None, choices=FORMATS,
                   help="default: fp32 and q4 on CPU, bf16 and q4 on CUDA")
    p.add_argument("--steps", type=int, default=8, help="decode steps profiled per configuration")
    p.add_argument("--k", type=int, default=4, help="the verify pass holds k + 1 tokens")
    p.add_argument("--context", type=int, default=profile.CONTEXT, help="cache positions before the steps")
    p.add_argument("--trace-dir", default=None, help="also write each configuration's Chrome trace here")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default=None, help="the results' file name (default profile-<device>; one per CPU kind)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    formats = args.weights or (["fp32", "q4"] if args.device == "cpu" else ["bf16", "q4"])
    notes: list[str] = []
    results = []
    with Telemetry(args.device) as tel:
        engs = engines(args.device, formats, args.context + args.steps + args.k + 16, notes)
        bw = measure_gbs(args.device)
        for e in engs.values():
            e.bandwidth_gbs = bw
        vocab = next(iter(engs.values())).config.vocab_size if engs else 1
        context = profile.synthetic_context(vocab, args.context)
        for cfg in configs(args.device, formats):  # saved after each: a run cut short keeps what it profiled
            results += profile.compare(engs, [cfg], steps=args.steps, k=args.k, context=context)
            result = dict(model=MODEL, device=args.device, steps=args.steps, k=args.k, context=args.context,
                          bandwidth_gbs=bw, notes=notes,
                          configs=[dict(label=r.config.label, fused=r.config.fused, graphs=r.config.graphs,
                                        weights=r.config.weights, reason=r.reason) for r in results],
                          summary=[s for r in results for s in r.summary], rows=[x for r in results for x in r.rows])
            result["provenance"] = provenance(args.device, tel)
            write_results(args.out, args.name or f"profile-{args.device}", result, markdown(result, results))
    result["provenance"] = provenance(args.device, tel)  # once more, the telemetry complete (the load after the run)
    write_results(args.out, args.name or f"profile-{args.device}", result, markdown(result, results))
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
        for i, r in enumerate(x for x in results if x.trace):
            (Path(args.trace_dir) / f"profile-{args.device}-{i}.json").write_text(json.dumps(r.trace))
    print(markdown(result, results))


if __name__ == "__main__":
    main()
