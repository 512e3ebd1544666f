"""The CUDA weight-only products alone: int8 and q4 blocks and bf16 weights (the GEMV up to 17 rows; past it the
blocks' dequantize route, bf16 straight to cuBLAS), at TinyLlama-1.1B's layer shapes.

    python -m bench.gemv [--out bench/results] [--tokens 1 6 16 17 64] [--formats q4 int8 bf16]

A sweep is one decode step's projections: 22 layers x (qkv 2048->2560, o 2048->2048, gate_up 2048->11264,
down 5632->2048), every layer its own tensors, so the sweep streams them from HBM as a step does (about 0.65 GB
in q4, far past the L2). It is captured once as a CUDA graph and replayed (launched from Python, the 88 calls
would cost more than the kernels) and timed with CUDA events, the median of --iters replays. GB/s counts the
weight bytes a sweep reads (scales and mins included); % of the device-to-device copy bandwidth measured in this
run. T = 1 is a decode step, 6 a verify pass, 16 the GEMV's largest token tile, 17 two launches; 64 rows take the
dequantize route (a dense copy of each weight written and read again), where GB/s is still the blocks' bytes over
the time: what that route costs against streaming them once. The JSON is rewritten after every case.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from bench.common import Telemetry, markdown_table, provenance, write_results
from bench.steps import shape_config
from engine import weights
from engine.ops import cuda, ext

DATASHEET_GBS = {"H200": 4800.0}  # the vendor's HBM bandwidth, by a word of the device's name


def layer_shapes(shape: str = "tinyllama") -> list[tuple[int, int]]:
    """(out, in) of one layer's projections, as engine/model.py merges them."""
    cfg = shape_config(shape)
    return [(cfg.q_size + 2 * cfg.kv_size, cfg.hidden_size), (cfg.hidden_size, cfg.q_size),
            (2 * cfg.intermediate_size, cfg.hidden_size), (cfg.hidden_size, cfg.intermediate_size)]


def random_weights(fmt: str, shapes: list[tuple[int, int]], layers: int, g: torch.Generator,
                   device: str = "cuda") -> list[weights.Packed]:
    """Every layer's projections in `fmt`, packed as the CUDA path holds them (the values do not change the time)."""
    out = []
    for _ in range(layers):
        for o, i in shapes:
            w = torch.randn(o, i, generator=g, device=device) * 0.02
            out.append(weights.pack(weights.quantize(w.to(torch.bfloat16), fmt), "cuda"))
    return out


def sweep(products: dict, ws: list[weights.Packed], xs: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Every weight's product with the activations of its width: products maps a format to its matmul (an OpSet's
    linear), xs a width to x [T, in]."""
    return [products[w.fmt](xs[w.in_features], w) for w in ws]


def time_sweep(products: dict, ws: list[weights.Packed], xs: dict[int, torch.Tensor], iters: int) -> float:
    """Median microseconds of one graph replay of the sweep."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # cuBLAS handles and workspaces, allocator pools: outside the capture
            sweep(products, ws, xs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sweep(products, ws, xs)
    graph.replay()
    events = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def datasheet_gbs(name: str) -> float | None:
    return next((v for k, v in DATASHEET_GBS.items() if k in name), None)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6, 16, 17, 64])
    p.add_argument("--formats", nargs="+", default=["q4", "int8", "bf16"], choices=["q4", "int8", "bf16"])
    p.add_argument("--layers", type=int, default=22)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench.gemv needs a CUDA device to time the kernels (torch sees no GPU here)")
    status = ext.load("cuda")
    if status.module is None:
        sys.exit(f"the fused kernels are not available, nothing to time: {status.reason}")
    from engine import ops
    from engine.observe.bandwidth import measure_gbs

    products = ops.cuda_ops(status.module, status.reason).linear
    name = torch.cuda.get_device_name(0)
    bw, sheet = measure_gbs("cuda"), datasheet_gbs(name)
    shapes = layer_shapes()
    result = dict(gpu=name, shapes=shapes, layers=args.layers, iters=args.iters, copy_bandwidth_gb_s=bw,
                  datasheet_gb_s=sheet, rows=[])
    head = (f"Weight-only products alone on {name}, TinyLlama-1.1B's layer shapes x {args.layers} layers, "
            f"bf16 activations; one sweep captured as a CUDA graph, median of {args.iters} replays. Copy bandwidth "
            f"in this run: {bw:.0f} GB/s" + (f"; datasheet: {sheet:.0f} GB/s." if sheet else ".") + "\n\n")
    cols = ["weights", "tokens", "route", "us", "weight_mb", "gb_s", "pct_of_copy_bw", "pct_of_datasheet"]
    g = torch.Generator(device="cuda").manual_seed(0)
    with Telemetry("cuda") as tel:
        for fmt in args.formats:
            ws = random_weights(fmt, shapes, args.layers, g)
            nbytes = sum(w.nbytes for w in ws)
            for T in args.tokens:
                xs = {i: torch.randn(T, i, device="cuda", dtype=torch.bfloat16, generator=g) for _, i in shapes}
                us = time_sweep(products, ws, xs, args.iters)
                gbs = nbytes / us / 1e3
                route = ("GEMV" if T <= cuda.GEMV_MAX_TOKENS else "cuBLAS" if fmt == "bf16" else
                         "dequantize + cuBLAS")
                result["rows"].append(dict(weights=fmt, tokens=T, route=route, us=us, weight_mb=nbytes / 1e6,
                                           gb_s=gbs, pct_of_copy_bw=100 * gbs / bw,
                                           pct_of_datasheet=100 * gbs / sheet if sheet else None))
                print(result["rows"][-1], flush=True)
                result["provenance"] = provenance("cuda", tel)
                write_results(args.out, "gemv-cuda", result, head + markdown_table(result["rows"], cols))
            del ws
            torch.cuda.empty_cache()
    result["provenance"] = provenance("cuda", tel)  # once more, the telemetry complete (the load after the run)
    write_results(args.out, "gemv-cuda", result, head + markdown_table(result["rows"], cols))
    print(head + markdown_table(result["rows"], cols))


if __name__ == "__main__":
    main()
