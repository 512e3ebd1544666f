"""Decode attention alone: the split-KV kernel against torch SDPA and the torch twin, batch 1.

    python -m bench.attention [--out bench/results] [--contexts 1024 4096 32768] [--shapes 32x8x128 9x3x64]

A shape is HxHkvxD (query heads x kv heads x head dim). Every call is timed with CUDA events right after
writing a buffer twice the size of L2, so K and V come from HBM as they do in a real decode step (the
layers in between evicted them). Achieved GB/s counts the bytes a call must move (K and V of the live
context, q, out); % of ceiling divides that by the device-to-device copy bandwidth measured in this run.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import Telemetry, markdown_table, provenance, write_results
from engine.bandwidth import measure_gbs
from engine.ops import ref, select


def time_us(fn, flush: torch.Tensor, iters: int, warmup: int) -> float:
    """Median microseconds of fn() with L2 flushed before each call."""
    for _ in range(warmup):
        fn()
    events = []
    for _ in range(iters):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def sdpa_call(q, k, v, scale):
    """SDPA on [B, H, 1, D] against the whole cache; GQA without copies where torch supports it."""
    q4 = q.unsqueeze(2)
    try:
        F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True).squeeze(2), "sdpa"
    except TypeError:  # torch < 2.5: repeat K/V once, outside the timed call (it then reads n_rep x the bytes)
        n_rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
        return lambda: F.scaled_dot_product_attention(q4, kr, vr, scale=scale).squeeze(2), "sdpa (repeated kv)"


def bench_shape(ops, shape: str, context: int, dtype, flush, bw_gbs: float, args) -> list[dict]:
    H, Hkv, D = (int(n) for n in shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(context)
    q = torch.randn(1, H, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(1, Hkv, context, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(1, Hkv, context, D, device="cuda", dtype=dtype, generator=g)
    seq_lens = torch.full((1,), context, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    out = torch.empty_like(q)
    want = ref.decode_attention(q, k, v, seq_lens, scale).float()
    sdpa, sdpa_name = sdpa_call(q, k, v, scale)
    impls = [
        ("decodescope", lambda: ops.decode_attention(q, k, v, seq_lens, scale, out=out)),
        (sdpa_name, sdpa),
        ("twin", lambda: ref.decode_attention(q, k, v, seq_lens, scale, out=out)),
    ]
    nbytes = (k.numel() + v.numel() + 2 * q.numel()) * q.element_size()
    rows = []
    for name, fn in impls:
        us = time_us(fn, flush, args.iters, args.warmup)
        err = (fn().float() - want).abs().max().item()
        gbs = nbytes / us / 1e3
        rows.append(dict(shape=shape, context=context, impl=name, us=us, gb_s=gbs, pct_of_copy_bw=100 * gbs / bw_gbs,
                         max_abs_err_vs_twin=err))
    base = next(r["us"] for r in rows if r["impl"].startswith("sdpa"))
    for r in rows:
        r["speedup_vs_sdpa"] = base / r["us"]
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 32768])
    p.add_argument("--shapes", nargs="+", default=["32x8x128", "9x3x64"], help="HxHkvxD")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench.attention needs a CUDA device: it times the fused decode-attention kernel, and torch "
                 "sees no GPU here")
    ops = select("cuda")
    if ops.name != "fused":
        sys.exit(f"the fused kernels are not available, nothing to time: {ops.reason}")
    dtype = getattr(torch, args.dtype)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * max(l2, 2**20), dtype=torch.uint8, device="cuda")
    bw = measure_gbs("cuda")
    with Telemetry("cuda") as tel:
        rows = [r for shape in args.shapes for context in args.contexts
                for r in bench_shape(ops, shape, context, dtype, flush, bw, args)]
    result = dict(dtype=args.dtype, batch=1, copy_bandwidth_gb_s=bw, l2_bytes=l2, iters=args.iters, rows=rows,
                  provenance=provenance("cuda", tel))
    head = (f"Decode attention alone, batch 1, {args.dtype}, L2 flushed before each call; median of {args.iters}. "
            f"Device-to-device copy bandwidth in this run: {bw:.0f} GB/s.\n\n")
    cols = ["shape", "context", "impl", "us", "gb_s", "pct_of_copy_bw", "speedup_vs_sdpa", "max_abs_err_vs_twin"]
    md = head + markdown_table(rows, cols)
    write_results(args.out, "attention-cuda", result, md)
    print(md)


if __name__ == "__main__":
    main()
