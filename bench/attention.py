"""Decode attention alone: the split-KV kernel against torch SDPA and the torch twin, batch 1, and the kernel's
analysis: bytes in flight per SM, instructions per byte from the kernel's structure, planned splits per length.

    python -m bench.attention [--out bench/results] [--contexts 1024 4096 32768] [--shapes 32x8x128 9x3x64]
    python -m bench.attention --analysis-only [--arch sm_90]   # no GPU: occupancy from ptxas's register counts

A shape is HxHkvxD (query heads x kv heads x head dim). Each context runs with full attention and with a
window of 512 plus 4 sinks (SDPA then masks the whole cache, as a plain implementation would). Every call is
timed with CUDA events right after writing a buffer twice the size of L2, so K and V come from HBM as in a
real decode step. Achieved GB/s counts the bytes a call must move (K and V of the attended keys, q, out); % of
ceiling divides that by the device-to-device copy bandwidth measured in this run. The JSON is rewritten after
every case, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


from bench.common import Telemetry, markdown_table, provenance, write_results
from engine.ops import ext
from engine.ops import cuda, ref

WINDOWS = [(0, 0), (512, 4)]  # (window, sinks); window 0 is full attention
HEADS_PER_BLOCK = (1, 2, 3, 4, 6, 8)  # the decode_kernel instances of csrc/cuda/decode_attention.cuh
THREADS, STAGES, MAX_SPLITS = 128, cuda.ATTN_STAGES, 256
# Without a GPU to ask: an H200 (HBM3e 4.8 TB/s, 132 SMs at 1.98 GHz, 228 KB shared memory per SM).
H200 = dict(gb_s=4800.0, sms=132, clock_ghz=1.98, smem_per_sm=228 * 1024)
SMEM_PER_SM = {"sm_80": 164 * 1024, "sm_90": 228 * 1024}


# --- analysis: what the kernel's structure costs -----------------------------------------------------------


def kernel_shape(H: int, Hkv: int, D: int, dtype: torch.dtype) -> dict:
    """The compile-time shape decode_attention.cuh picks for these heads (its Shape<T, D, kHeads>)."""
    vec = 16 // dtype.itemsize
    lanes = D // vec
    group = H // Hkv
    head_blocks = -(-group // 8)
    per_block = -(-group // head_blocks)
    tile = cuda.attention_tile_keys(D, dtype)
    return dict(vec=vec, lanes=lanes, slots=THREADS // lanes, tile_keys=tile, keys_per_thread=tile * lanes // THREADS,
                heads=min(h for h in HEADS_PER_BLOCK if h >= per_block), live_heads=per_block, head_blocks=head_blocks)


def instructions_per_tile(s: dict, dtype: torch.dtype) -> dict:
    """One thread's instructions for one full tile (kKeys keys of K and V), counted from the kernel's loops.

    Per key: an LDS.128 of K and of V, one conversion per element (none for fp32), vec FFMAs per head for
    q.k and again for p.v, log2(lanes) SHFL + FADD per head to finish the dot. Per head and tile: the max over
    the keys, the -inf guard, one ex2 for the rescale, per key an FADD + ex2 + FADD into the sum, vec FMULs
    rescaling the accumulator. Per 16 bytes copied: the cp.async and its address."""
    k, h, v = s["keys_per_thread"], s["heads"], s["vec"]
    useful = 2 * k * h * v
    counts = dict(
        fma=useful,
        convert=0 if dtype == torch.float32 else 2 * k * v,
        lds=2 * k,
        shuffle=2 * k * h * int(math.log2(s["lanes"])),
        softmax=h * (k + 2 + 2 + 3 * k + 1 + v),
        pipeline=2 * k * 3 + 6,
    )
    counts["total"] = sum(counts.values())
    return counts


def analysis(shape: str, dtype: torch.dtype, blocks_per_sm: int, machine: dict, contexts: list[int]) -> dict:
    H, Hkv, D = (int(n) for n in shape.split("x"))
    s = kernel_shape(H, Hkv, D, dtype)
    instr = instructions_per_tile(s, dtype)
    tile_bytes = 2 * s["tile_keys"] * D * dtype.itemsize  # K and V of one tile, all threads of a block
    per_byte = instr["total"] * THREADS / tile_bytes
    bytes_per_clock = machine["gb_s"] / machine["sms"] / machine["clock_ghz"]  # what one SM must consume
    budget = 4 * 32 / bytes_per_clock  # 4 schedulers issue one warp instruction (32 lanes) per clock
    pairs = Hkv * s["head_blocks"]  # batch 1
    splits = min(MAX_SPLITS, max(1, machine["sms"] * blocks_per_sm // pairs))
    plans = []
    for context in contexts:
        for window, sinks in WINDOWS:
            live = cuda.live_keys(context, window, sinks)
            active, per = cuda.active_splits(live, s["tile_keys"], splits)
            plans.append(dict(context=context, window=window, sinks=sinks, live_keys=live, active_splits=active,
                              keys_per_split=per, blocks=active * pairs,
                              wave_fraction=active * pairs / (machine["sms"] * blocks_per_sm)))
    return dict(shape=shape, dtype=str(dtype)[6:], **s, blocks_per_sm=blocks_per_sm,
                bytes_in_flight_per_sm=blocks_per_sm * (STAGES - 1) * tile_bytes,
                instructions_per_tile=instr, thread_instructions_per_byte=per_byte,
                issue_budget_per_byte=budget, issue_fraction=per_byte / budget,
                useful_fma_fraction=instr["fma"] / instr["total"], grid_splits=splits, plans=plans)


def ptxas_blocks_per_sm(arch: str, dtype: torch.dtype, head_dim: int, heads: int) -> int:
    """Occupancy of one decode_kernel instance from nvcc -Xptxas=-v: registers (8 per thread granularity),
    its 48 KB of static shared memory (+1 KB reserved per block), 16 blocks of 128 threads."""
    names = {torch.float32: "f", torch.float16: "6__half", torch.bfloat16: "13__nv_bfloat16"}
    regs = ptxas_registers(arch)[f"decode_kernelI{names[dtype]}Li{head_dim}ELi{heads}E"]
    warp_regs = -(-regs * 32 // 256) * 256
    return min(65536 // (4 * warp_regs), SMEM_PER_SM[arch] // ((2 * STAGES * cuda.ATTN_TILE_BYTES) + 1024),
               2048 // THREADS)


_REGISTERS: dict[str, dict[str, int]] = {}


def ptxas_registers(arch: str) -> dict[str, int]:
    if arch not in _REGISTERS:
        if shutil.which("nvcc") is None:
            sys.exit("--analysis-only needs nvcc on PATH to read the kernels' register counts")
        from torch.utils import cpp_extension

        proc = subprocess.run(["nvcc", "-std=c++17", "-O3", *cpp_extension.COMMON_NVCC_FLAGS, f"-arch={arch}",
                               "-Xptxas=-v", "-c", str(ext.CSRC / "cuda" / "kernels.cu"), "-o", "/dev/null"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = re.findall(r"Compiling entry function '\S*?(decode_kernelI\S+?E)EEv\S*'.*?\n.*?\n.*?\n"
                           r"ptxas info\s*: Used (\d+) registers", proc.stderr)
        _REGISTERS[arch] = {name: int(regs) for name, regs in found}
    return _REGISTERS[arch]


# --- timing on the GPU ---------------------------------------------------------------------------------


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


def sdpa_call(q, k, v, scale, mask):
    """SDPA on [B, H, 1, D] against the whole cache (mask: [S] bool or None); GQA without copies where torch
    supports it."""
    q4 = q.unsqueeze(2)
    m = None if mask is None else mask.view(1, 1, 1, -1)
    try:
        F.scaled_dot_product_attention(q4, k, v, attn_mask=m, scale=scale, enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q4, k, v, m, scale=scale, enable_gqa=True).squeeze(2), "sdpa"
    except TypeError:  # torch < 2.5: repeat K/V once, outside the timed call (it then reads n_rep x the bytes)
        n_rep = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(n_rep, 1), v.repeat_interleave(n_rep, 1)
        return lambda: F.scaled_dot_product_attention(q4, kr, vr, m, scale=scale).squeeze(2), "sdpa (repeated kv)"


def bench_case(kernels, shape: str, context: int, window: int, sinks: int, dtype, flush, bw_gbs: float,
               args) -> list[dict]:
    H, Hkv, D = (int(n) for n in shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(context)
    q = torch.randn(1, H, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(1, Hkv, context, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(1, Hkv, context, D, device="cuda", dtype=dtype, generator=g)
    seq_lens = torch.full((1,), context, dtype=torch.int32, device="cuda")
    scale = D ** -0.5
    out = torch.empty_like(q)
    want = ref.decode_attention(q, k, v, seq_lens, scale, window, sinks).float()
    j = torch.arange(context, device="cuda")
    mask = None if window == 0 else (j < sinks) | (j >= context - window)
    sdpa, sdpa_name = sdpa_call(q, k, v, scale, mask)
    impls = [
        ("decodescope", lambda: kernels.decode_attention(q, k, v, seq_lens, scale, window, sinks, out=out)),
        (sdpa_name, sdpa),
        ("twin", lambda: ref.decode_attention(q, k, v, seq_lens, scale, window, sinks, out=out)),
    ]
    live = cuda.live_keys(context, window, sinks)
    nbytes = (2 * Hkv * live * D + 2 * q.numel()) * q.element_size()
    rows = []
    for name, fn in impls:
        us = time_us(fn, flush, args.iters, args.warmup)
        err = (fn().float() - want).abs().max().item()
        gbs = nbytes / us / 1e3
        rows.append(dict(shape=shape, context=context, window=window, sinks=sinks, impl=name, us=us, gb_s=gbs,
                         pct_of_copy_bw=100 * gbs / bw_gbs, max_abs_err_vs_twin=err))
    base = next(r["us"] for r in rows if r["impl"].startswith("sdpa"))
    for r in rows:
        r["speedup_vs_sdpa"] = base / r["us"]
    return rows


# --- report ------------------------------------------------------------------------------------------------

ANALYSIS_COLS = ["shape", "dtype", "heads", "blocks_per_sm", "bytes_in_flight_per_sm", "thread_instructions_per_byte",
                 "issue_budget_per_byte", "issue_fraction", "useful_fma_fraction", "grid_splits"]
PLAN_COLS = ["shape", "context", "window", "sinks", "live_keys", "active_splits", "keys_per_split", "blocks",
             "wave_fraction"]
TIMING_COLS = ["shape", "context", "window", "impl", "us", "gb_s", "pct_of_copy_bw", "speedup_vs_sdpa",
               "max_abs_err_vs_twin"]


def report(result: dict, head: str) -> str:
    plans = [dict(shape=a["shape"], **p) for a in result["analysis"] for p in a["plans"]]
    md = head + "\n\nKernel analysis (per thread and tile, from the kernel's loops):\n\n"
    md += markdown_table(result["analysis"], ANALYSIS_COLS) + "\nPlanned splits per live length (batch 1):\n\n"
    md += markdown_table(plans, PLAN_COLS)
    if result.get("rows"):
        md += "\nTimings:\n\n" + markdown_table(result["rows"], TIMING_COLS)
    return md


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 32768])
    p.add_argument("--shapes", nargs="+", default=["32x8x128", "9x3x64"], help="HxHkvxD")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--analysis-only", action="store_true", help="no timing; occupancy from ptxas (needs nvcc)")
    p.add_argument("--arch", default="sm_90", choices=sorted(SMEM_PER_SM), help="with --analysis-only")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.analysis_only:
        machine = H200 if args.arch == "sm_90" else dict(gb_s=2039.0, sms=108, clock_ghz=1.41)  # A100 80GB
        analyses = []
        for shape in args.shapes:
            H, Hkv, D = (int(n) for n in shape.split("x"))
            occupancy = ptxas_blocks_per_sm(args.arch, dtype, D, kernel_shape(H, Hkv, D, dtype)["heads"])
            analyses.append(analysis(shape, dtype, occupancy, machine, args.contexts))
        result = dict(dtype=args.dtype, arch=args.arch, machine=machine, analysis=analyses,
                      provenance=provenance("cpu"))
        head = (f"Decode attention analysis, {args.dtype}, {args.arch} occupancy from ptxas, budgets for "
                f"{machine['gb_s']:.0f} GB/s over {machine['sms']} SMs at {machine['clock_ghz']} GHz (no timing).")
        write_results(args.out, f"attention-analysis-{args.arch}", result, report(result, head))
        print(report(result, head))
        return
    if not torch.cuda.is_available():
        sys.exit("bench.attention needs a CUDA device to time the kernel (torch sees no GPU here); "
                 "--analysis-only reports the structure without one")
    from engine.observe.bandwidth import measure_gbs

    status = ext.load("cuda")
    if status.module is None:
        sys.exit(f"the fused kernels are not available, nothing to time: {status.reason}")
    kernels = cuda.CudaOps(status.module)
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    flush = torch.empty(2 * max(l2, 2**20), dtype=torch.uint8, device="cuda")
    bw = measure_gbs("cuda")
    smi = shutil.which("nvidia-smi")
    clock = smi and subprocess.run([smi, "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True).stdout.split()
    # the issue budget needs the SM clock; without nvidia-smi, an H200's
    machine = dict(gb_s=bw, sms=props.multi_processor_count,
                   clock_ghz=float(clock[0]) / 1e3 if clock else H200["clock_ghz"])
    module = status.module
    analyses = []
    for shape in args.shapes:
        H, Hkv, D = (int(n) for n in shape.split("x"))
        _, _, occupancy = module.decode_attention_plan(torch.empty(1, H, D, dtype=dtype, device="cuda"), Hkv)
        analyses.append(analysis(shape, dtype, occupancy, machine, args.contexts))
    result = dict(dtype=args.dtype, batch=1, copy_bandwidth_gb_s=bw, l2_bytes=l2, iters=args.iters, machine=machine,
                  analysis=analyses, rows=[])
    head = (f"Decode attention alone, batch 1, {args.dtype}, L2 flushed before each call; median of {args.iters}. "
            f"Device-to-device copy bandwidth in this run: {bw:.0f} GB/s.")
    with Telemetry("cuda") as tel:
        for shape in args.shapes:
            for context in args.contexts:
                for window, sinks in WINDOWS:
                    result["rows"] += bench_case(kernels, shape, context, window, sinks, dtype, flush, bw, args)
                    result["provenance"] = provenance("cuda", tel)  # written as each case ends
                    write_results(args.out, "attention-cuda", result, report(result, head))
    result["provenance"] = provenance("cuda", tel)
    write_results(args.out, "attention-cuda", result, report(result, head))
    print(report(result, head))


if __name__ == "__main__":
    main()
