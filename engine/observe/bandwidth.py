"""Memory bandwidth measured on the spot, for the "% of the bandwidth ceiling" figure.

At batch 1 a decode step reads every weight once, so bandwidth / weight bytes is the fastest any engine
could decode on this machine. The figure is only honest if the bandwidth comes from the same machine in
the same run, so it is measured here rather than taken from a spec sheet.
"""
from __future__ import annotations

import time

import torch


def measure_gbs(device, nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Best-of-`repeats` GB/s. CUDA: a device-to-device copy (bytes read + bytes written).
    CPU: a read-only reduction, since a decode step on CPU is a stream of weight reads."""
    device = torch.device(device)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if device.type == "cuda":
        y = torch.empty_like(x)
        y.copy_(x)
        best = float("inf")
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            y.copy_(x)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        return 2 * nbytes / best / 1e9
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9
