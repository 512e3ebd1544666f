"""What a verify pass's tile competes for inside one core: the AVX-512 VNNI dot product (VPDPBUSD) timed alone and
beside the other instructions of a q4 / q4_a8 block, in a C loop compiled here (gcc, inline assembly, no memory
traffic but the broadcast loads).

    python -m bench.ports [--name ports-cpu-zen4]

Each mix is one loop iteration shaped like a tile of 6 rows over one block of 16 outputs x 32 inputs: 6
independent accumulator chains of VPDPBUSD (8 a row for q4_a8's 8-bit activations, 16 for q4's two 8-bit
halves), then the extra instructions named. ns_per_iter is the best of `--repeats` runs of `--iters` iterations;
extra_ns what the mix adds to the dot products alone: ~0 where its instructions issue on other ports, and about
their count times a VPDPBUSD's time where they share its port(s). The same mixes over 12 chains (two blocks in
flight, as out-of-order execution overlaps a tile's consecutive blocks) tell a port's pace from a chain's: where
12 chains issue a VPDPBUSD faster than 6, 6 chains wait on the instruction's latency, not on a port (the Xeon:
two ports, 5 cycles a chain link), and the extra instructions fill those waits. From these, a tile's floor in
that port's cycles (gemm.h q4a8_tile, q4_tile) follows, against the block's memory time at the read bandwidth
measured beside it. Needs an x86-64 CPU with AVX-512 VNNI and gcc.
"""
from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from bench.common import markdown_table, provenance, write_results
from engine.observe.bandwidth import measure_gbs


def dots(per_row: int, chains: int = 6) -> str:
    """`chains` rows' chains (zmm10 on), per_row VPDPBUSD each, interleaved as a tile issues them."""
    return "".join(f"vpdpbusd %%zmm30, %%zmm31, %%zmm{10 + r}\\n\\t" for _ in range(per_row) for r in range(chains))


def repeat(ins: str, n: int) -> str:
    """n copies of one instruction, written to rotating registers zmm0-9 (no chain between copies)."""
    return "".join(ins.format(i % 10) + "\\n\\t" for i in range(n))


FMA = "vfmadd231ps %%zmm29, %%zmm28, %%zmm{}"
MUL = "vmulps %%zmm29, %%zmm28, %%zmm{}"
CVT = "vcvtdq2ps %%zmm29, %%zmm{}"
AND = "vpandd %%zmm29, %%zmm28, %%zmm{}"
SHIFT = "vpsrlw $4, %%zmm29, %%zmm{}"
BCAST = "vpbroadcastd 4(%0), %%zmm{}"

MIXES = [  # (name, VPDPBUSD a row, chains, extra instructions, what the mix stands for)
    ("q4_a8 block, 6 rows: dot products", 8, 6, "", "8 VPDPBUSD a row"),
    ("+ the fold's multiplies", 8, 6, repeat(FMA, 12) + repeat(MUL, 6), "+ 12 FMA + 6 VMULPS (fold_q4, 3 a row)"),
    ("+ conversions", 8, 6, repeat(CVT, 6), "+ 6 VCVTDQ2PS"),
    ("+ nibble masks and shifts", 8, 6, repeat(AND, 8) + repeat(SHIFT, 4), "+ 8 VPANDD + 4 VPSRLW"),
    ("+ activation broadcasts", 8, 6, repeat(BCAST, 48), "+ 48 VPBROADCASTD from memory"),
    ("q4 block, 6 rows: dot products", 16, 6, "", "16 VPDPBUSD a row (two 8-bit halves)"),
    ("q4 + the fold's multiplies", 16, 6, repeat(FMA, 12) + repeat(MUL, 6), "+ 12 FMA + 6 VMULPS"),
    ("q4_a8, two blocks in flight: dot products", 8, 12, "", "8 VPDPBUSD a row, 12 chains"),
    ("+ both blocks' fold multiplies", 8, 12, repeat(FMA, 24) + repeat(MUL, 12), "+ 24 FMA + 12 VMULPS"),
    ("+ both blocks' conversions, masks, shifts", 8, 12, repeat(CVT, 12) + repeat(AND, 16) + repeat(SHIFT, 8),
     "+ 12 VCVTDQ2PS + 16 VPANDD + 8 VPSRLW"),
]

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static int buf[64] __attribute__((aligned(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  long iters = atol(argv[1]); int repeats = atoi(argv[2]);
%s
  return 0;
}
"""

MIX = r"""  {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      double t = now();
      for (long i = 0; i < iters; ++i) __asm__ volatile("%s" : : "r"(buf) : "memory");
      double s = now() - t;
      if (s < best) best = s;
    }
    printf("%%d %%.4f\n", %d, 1e9 * best / iters);
  }
"""


def run(iters: int, repeats: int) -> list[dict]:
    body = "".join(MIX % (dots(per_row, chains) + extra, k) for k, (_, per_row, chains, extra, _) in enumerate(MIXES))
    with tempfile.TemporaryDirectory(prefix="ports-") as tmp:
        src, exe = Path(tmp) / "ports.c", Path(tmp) / "ports"
        src.write_text(SOURCE % body)
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True, capture_output=True, text=True)
        out = subprocess.run([str(exe), str(iters), str(repeats)], check=True, capture_output=True, text=True).stdout
    ns = {int(k): float(v) for k, v in (line.split() for line in out.splitlines())}
    rows, base = [], None
    for k, (name, per_row, chains, extra, what) in enumerate(MIXES):
        if not extra:
            base = ns[k]
        rows.append(dict(mix=name, instructions=what, chains=chains, vpdpbusd=chains * per_row, ns_per_iter=ns[k],
                         ns_per_vpdpbusd=base / (chains * per_row), extra_ns=ns[k] - base))
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="ports-cpu")
    args = p.parse_args(argv)
    gbs = measure_gbs("cpu")
    rows = run(args.iters, args.repeats)
    # a q4 block of 16 x 32 weights is 320 bytes (256 of nibbles, 16 fp16 scales and 16 mins); each of 2 cores
    # streams half of the read bandwidth
    block_ns = 320 / (gbs / 2)
    result = dict(rows=rows, read_gb_s=gbs, q4_block_memory_ns=block_ns, provenance=provenance("cpu"))
    md = (f"One core, the best of {args.repeats} runs of {args.iters} iterations; a q4 block's memory time at the "
          f"read bandwidth measured here ({gbs:.1f} GB/s over 2 cores): {block_ns:.1f} ns.\n\n"
          + markdown_table(rows, ["mix", "instructions", "chains", "vpdpbusd", "ns_per_iter", "ns_per_vpdpbusd",
                                  "extra_ns"]))
    write_results(args.out, args.name, result, md)
    print(md)


if __name__ == "__main__":
    main()
