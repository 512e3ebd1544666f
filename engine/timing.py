"""Timestamps that cost nothing extra: CUDA events on CUDA (read after the sync a step needs anyway),
perf_counter on CPU. Round boundaries are wall time (perf_counter) taken after that sync."""
from __future__ import annotations

import resource
import time

import torch


class Clock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        """Milliseconds between two marks; on CUDA only valid once b has completed (after a sync)."""
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_mb(self) -> float:
        """CUDA peak allocation since reset_peak on GPU; the process's peak RSS on CPU."""
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def now_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
