"""Which cores the two sides of bench.ui run on, and what the browser's side costs them.

The engine's side is this process, every thread of it (the engine, the pump, gradio's server); the browser's side
is every process this one started (Playwright's driver, Chromium's browser, zygotes, renderers and GPU process).
Both are read from /proc, and only our own descendants are counted or pinned: on a shared machine another
person's Chromium is not ours to measure or move.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path


def _stat(pid: int | str) -> tuple[str, list[str]]:
    """(comm, the fields after it) of /proc/pid/stat; comm may hold spaces and parentheses, so split at the last ')'."""
    text = Path(f"/proc/{pid}/stat").read_text()
    head, tail = text.rsplit(")", 1)
    return head.split("(", 1)[1], tail.split()


def descendants(root: int) -> list[int]:
    """Every live process below `root` in the process tree (children, theirs, ...), not root itself."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            children.setdefault(int(_stat(pid)[1][1]), []).append(int(pid))
        except (OSError, IndexError, ValueError):  # the process ended between listing and reading
            continue
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # the process ended
        return []


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` on `cpus`: a process's affinity is per thread, and the ones it starts later inherit it."""
    for tid in _tasks(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # the thread ended
            continue


def keep(pids: list[int], cpus: frozenset[int]) -> int:
    """Moves back onto `cpus` every thread of `pids` that is elsewhere; returns how many it moved. (Chromium's GPU
    process pins the worker threads of its software renderer, SwiftShader's, one per core of its own choosing, as
    it starts them: a pin made once at launch does not hold for those.)"""
    moved = 0
    for pid in pids:
        for tid in _tasks(pid):
            try:
                if os.sched_getaffinity(tid) != cpus:
                    os.sched_setaffinity(tid, cpus)
                    moved += 1
            except ProcessLookupError:
                continue
    return moved


def ran_on(pids: list[int]) -> list[int]:
    """The union of the cores every thread of `pids` may run on now (the check that a pin held)."""
    cpus: set[int] = set()
    for pid in pids:
        for tid in _tasks(pid):
            try:
                cpus |= os.sched_getaffinity(tid)
            except ProcessLookupError:
                continue
    return sorted(cpus)


@dataclass(frozen=True)
class Split:
    engine: frozenset[int]
    browser: frozenset[int]


def split(cpus: set[int]) -> Split | str:
    """The engine's cores and the browser's: a quarter to the browser (at least one), the rest to the engine; on
    fewer than two cores, the reason there is no split."""
    if len(cpus) < 2:
        return (f"the browser cannot be pinned away from the engine: this process may run on {len(cpus)} core "
                f"({sorted(cpus)}), and pinning needs at least 2")
    ordered = sorted(cpus)
    n_browser = max(1, len(ordered) // 4)
    return Split(engine=frozenset(ordered[:-n_browser]), browser=frozenset(ordered[-n_browser:]))


class ChromiumCPU:
    """Samples the CPU time of our Chromium processes (/proc, utime + stime) every 20 ms on its own thread, so the
    browser's share of the cores over any stretch of a run can be read afterwards (cores()). `on`: the browser's
    own cores, where the engine has others: the sampling thread runs there, and our browser's threads are kept
    there (keep(); `moved` counts the threads it brought back).

    This thread shares the engine's process, and so its interpreter lock: what it does between two samples is
    kept small. A sample reads the stat files of the Chromium processes found at the last scan of the process
    tree, and the scan (every stat file in /proc) and keep() run every `rescan_s`. Scanning and keeping at every
    sample took ~1.5 ms a sample with 69 processes on the machine, every 20 ms, on the engine's own lock: the busiest
    Python thread of a bench.ui run (py-spy), and a cost of the measurement that the app never pays."""

    def __init__(self, interval_s: float = 0.02, root: int | None = None, on: frozenset[int] | None = None,
                 rescan_s: float = 0.5):
        self.samples: list[tuple[float, float]] = []  # (time.time() * 1e3, CPU seconds of all Chromium processes)
        self.root = os.getpid() if root is None else root
        self.on, self.moved, self.rescan_s = on, 0, rescan_s
        self.chromium: list[int] = []  # the Chromium processes below root at the last scan
        self.last: dict[int, int] = {}  # each one's ticks at its last sample (an ended one's stay in the total)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def _scan(self) -> None:
        ours = descendants(self.root)
        if self.on:
            self.moved += keep(ours, self.on)
        found = []
        for pid in ours:
            try:
                if "chrom" in _stat(pid)[0]:
                    found.append(pid)
            except (OSError, IndexError, ValueError):  # the process ended between listing and reading
                continue
        self.chromium = found

    def _cpu_s(self) -> float:
        for pid in self.chromium:
            try:
                fields = _stat(pid)[1]
                self.last[pid] = int(fields[11]) + int(fields[12])
            except (OSError, IndexError, ValueError):  # ended: its last ticks stay counted
                continue
        return sum(self.last.values()) / self._tick

    def _run(self, interval_s: float) -> None:
        if self.on:
            os.sched_setaffinity(0, self.on)  # this thread only
        next_scan = 0.0
        while True:
            if time.monotonic() >= next_scan:
                self._scan()
                next_scan = time.monotonic() + self.rescan_s
            self.samples.append((time.time() * 1e3, self._cpu_s()))
            if self._stop.wait(interval_s):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def cores(self, t0_ms: float, t1_ms: float) -> float:
        """Chromium's CPU seconds per second between two wall-clock stamps (the nearest samples inside)."""
        inside = [s for s in self.samples if t0_ms <= s[0] <= t1_ms]
        if len(inside) < 2:
            return float("nan")
        (a_t, a_c), (b_t, b_c) = inside[0], inside[-1]
        return (b_c - a_c) / ((b_t - a_t) / 1e3)
