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
        return peak_rss() / 2**20


def proc_status(key: str, pid: int | str = "self") -> int | None:
    """A /proc/PID/status figure (VmHWM, VmRSS: kB there) in bytes; None once the process has exited, or
    without /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":")), None)
    except OSError:
        return None


def peak_rss() -> int:
    """This process's own peak RSS in bytes: VmHWM, which starts afresh at exec. Not getrusage's ru_maxrss
    (the fallback without /proc): Linux carries the spawning process's RSS into it across fork and exec, so an
    app started by a process holding 2 GB would report at least 2 GB."""
    own = proc_status("VmHWM")
    return own if own is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def now_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
