"""How fast each of the machine's CPUs runs the same work, over time: bench.tile_pace's driver (a 6-row q4_a8 tile
over a matrix in L2, no memory traffic to speak of) pinned to one CPU, then the next, round after round.

    python -m bench.vcpus [--rounds 20] [--pause 2] [--name vcpus-cpu-<kind>]

A vCPU of a virtual machine is a host thread: when the host runs other work on the core under it (or on that core's
other hyperthread) the vCPU slows, and not every vCPU at once. An even split of a kernel's work over two threads
then waits on the slower, whatever the kernel. Each round times the driver on every CPU in turn (its order turned
every round), then on all of them at once (one process pinned to each); ns_per_block is the driver's time of a
block of 16 outputs x 32 inputs for 6 rows. slowest_over_fastest: within a round, the slowest CPU's time over the
fastest's; fastest_cpu: which one was fastest. Rounds are --pause seconds apart, so a run spans minutes.
Needs Linux (sched_setaffinity), an x86-64 CPU with AVX-512 VNNI and g++.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench import tile_pace
from bench.common import markdown_table, run_and_save

T = 6


def steal_ms() -> dict[int, float]:
    """Each CPU's steal time so far (/proc/stat: time the hypervisor ran something else while this vCPU wanted to
    run), in ms; empty where the kernel does not report it."""
    out = {}
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            f = line.split()
            if f[0].startswith("cpu") and f[0][3:].isdigit() and len(f) > 8:
                out[int(f[0][3:])] = 1000 * int(f[8]) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return out


def pinned(exe: Path, cpu: int, repeats: int) -> subprocess.Popen:
    """The driver's L2 regime (q4_a8, 6 rows) on one CPU."""
    return subprocess.Popen([str(exe), "1", str(T), str(repeats), "0", "0"], stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))


def bench(args) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    rounds = []
    with tempfile.TemporaryDirectory(prefix="vcpus-") as tmp:
        exe = tile_pace.build(Path(tmp))
        for r in range(args.rounds):
            order = cpus[r % len(cpus):] + cpus[:r % len(cpus)]
            alone, stolen = {}, {}
            for cpu in order:
                before = steal_ms()
                p = pinned(exe, cpu, args.repeats)
                alone[cpu] = float(p.communicate()[0])
                stolen[cpu] = steal_ms().get(cpu, 0.0) - before.get(cpu, 0.0)
            procs = {cpu: pinned(exe, cpu, args.repeats) for cpu in cpus}
            together = {cpu: float(p.communicate()[0]) for cpu, p in procs.items()}
            fastest = min(alone, key=alone.get)
            rounds.append(dict(t_s=round(time.time(), 1), alone=alone, together=together, stolen=stolen,
                               fastest_cpu=fastest,
                               slowest_over_fastest=max(alone.values()) / alone[fastest]))
            print(r, {c: round(v, 1) for c, v in alone.items()}, {c: round(v, 1) for c, v in together.items()},
                  flush=True)
            time.sleep(args.pause)
    ratios = [rd["slowest_over_fastest"] for rd in rounds]
    rows = [dict(round=i, seconds=round(rd["t_s"] - rounds[0]["t_s"]),
                 **{f"cpu{c}_ns": rd["alone"][c] for c in cpus},
                 **{f"cpu{c}_together_ns": rd["together"][c] for c in cpus},
                 **{f"cpu{c}_steal_ms": rd["stolen"][c] for c in cpus},
                 fastest_cpu=rd["fastest_cpu"], slowest_over_fastest=rd["slowest_over_fastest"])
            for i, rd in enumerate(rounds)]
    return dict(cpus=cpus, rows=rows, rounds=args.rounds, repeats=args.repeats, pause_s=args.pause,
                median_slowest_over_fastest=statistics.median(ratios), max_slowest_over_fastest=max(ratios),
                rounds_fastest={c: sum(rd["fastest_cpu"] == c for rd in rounds) for c in cpus})


def markdown(result: dict) -> str:
    cpus = result["cpus"]
    head = (f"One 6-row q4_a8 tile sweep over a matrix in L2 (bench.tile_pace's driver), ns a block, on each CPU alone "
            f"and on all at once, {result['rounds']} rounds {result['pause_s']} s apart. Slowest over fastest CPU "
            f"within a round: median {result['median_slowest_over_fastest']:.2f}, largest "
            f"{result['max_slowest_over_fastest']:.2f}; rounds each CPU was the fastest: "
            + ", ".join(f"cpu{c} {n}" for c, n in result["rounds_fastest"].items()) + ".\n\n")
    cols = ["round", "seconds", *[f"cpu{c}_ns" for c in cpus], *[f"cpu{c}_together_ns" for c in cpus],
            *[f"cpu{c}_steal_ms" for c in cpus], "fastest_cpu", "slowest_over_fastest"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pause", type=float, default=2.0, help="seconds between rounds")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="vcpus-cpu")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args), markdown)


if __name__ == "__main__":
    main()
