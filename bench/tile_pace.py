"""A GEMM tile's own pace: csrc/cpu/gemm.h's q4_a8 and int8 tiles compiled into a C++ driver here (g++, the
AVX-512 VNNI translation unit's flags) and run over packed panels with nothing around them: no Python, no call,
no activation quantization, no handoff between threads. What the whole-call timings (bench.overlap, bench.kernels)
add on top of this is the calls' own work.

    python -m bench.tile_pace [--rows 1 6 8 16] [--rounds 7] [--name tile-pace-cpu-<kind>]

ns_per_block: the time of a block of 16 outputs x 32 inputs for all T rows (in tiles of 8 rows at most, as gemm.h's
kRowsA8 / kRowsI8 cut them: T = 16 is two tiles over each block), three ways:
  - l2: one thread, a 1536 x 576 matrix (0.55 MB of q4_a8) resident in L2, swept 20 times;
  - stream: one thread over --stream-mb of weights, each block read from memory once a sweep;
  - stream_2threads: two threads at once, each over its own half of those weights, as a step's GEMMs split them;
    ns_per_block is per thread (a core's pace).
over_T1: ns_per_block over T = 1's in the same regime and round (what the tiles alone make of a verify pass's
GEMMs, T rows against one). The regimes and T alternate within a round, each in a fresh process; each figure is
the best of the round's --repeats, then the median over rounds. The tiles' numerics are tested elsewhere
(tests/test_kernels_cpu.py, tests/test_batch_invariance.py); this times them. Needs an x86-64 CPU with AVX-512
VNNI and g++.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path

from bench.common import markdown_table, run_and_save
from engine.observe.bandwidth import measure_gbs

CSRC = Path(__file__).resolve().parents[1] / "csrc" / "cpu"

SOURCE = r"""
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "table.h"
#include "simd_avx512.h"
using namespace decodescope::cpu;
using G = Gemm<Avx512>;
template <int R> void a8(const LinearArgs& a, int64_t p, int r0) { G::template q4a8_tile<R>(a, p, r0); }
template <int R> void i8(const LinearArgs& a, int64_t p, int r0) { G::template i8_tile<R>(a, p, r0); }
#pragma GCC pop_options
typedef void (*Tile)(const LinearArgs&, int64_t, int);
static Tile tile(bool q4a8, int r) {
  static const Tile a[] = {a8<1>, a8<2>, a8<3>, a8<4>, a8<5>, a8<6>, a8<7>, a8<8>};
  static const Tile b[] = {i8<1>, i8<2>, i8<3>, i8<4>, i8<5>, i8<6>, i8<7>, i8<8>};
  return (q4a8 ? a : b)[r - 1];
}
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Matrix {  // random packed panels of one format, activations for up to 16 rows
  bool q4a8; int out, in, nb, P;
  std::vector<uint8_t> w; std::vector<uint16_t> d; std::vector<int8_t> qx; std::vector<float> fold, dx, y;
  std::vector<int32_t> qoff;
  Matrix(bool q, int o, int i) : q4a8(q), out(o), in(i), nb(i / 32), P(o / 16) {
    srand(1);
    const size_t block = q4a8 ? kQ4BlockBytes : 32 * 16;
    w.resize(size_t(P) * nb * block);
    for (auto& b : w) b = rand();
    if (q4a8)
      for (size_t k = 0; k < size_t(P) * nb; ++k)  // fp16 scales and mins of a sane size
        for (int j = 0; j < 32; ++j)
          reinterpret_cast<uint16_t*>(w.data() + k * block + kQ4Nibbles)[j] = 0x2000 + (rand() & 0x3ff);
    d.resize(size_t(P) * nb * 16);
    for (auto& v : d) v = 0x2000 + (rand() & 0x3ff);
    qx.resize(16 * size_t(nb) * 32);
    for (auto& v : qx) v = rand() % 255 - 127;
    fold.resize(2 * 16 * nb); dx.resize(16 * nb); qoff.resize(16 * nb); y.resize(16 * size_t(out));
    for (auto& v : fold) v = (rand() % 1000) * 1e-3f;
    for (auto& v : dx) v = 1e-3f;
    for (auto& v : qoff) v = 0;
  }
  LinearArgs args(int T) {
    LinearArgs a{};
    a.y = y.data(); a.ldy = out; a.rows = T; a.in = in; a.n_out = out; a.nb = nb; a.w = w.data(); a.d = d.data();
    a.qx = qx.data(); a.fold = fold.data(); a.dx = dx.data(); a.qoff = qoff.data();
    return a;
  }
  void sweep(int T, int p0, int p1) {
    const LinearArgs a = args(T);
    for (int p = p0; p < p1; ++p)
      for (int r0 = 0; r0 < T; r0 += 8) tile(q4a8, T - r0 < 8 ? T - r0 : 8)(a, p, r0);
  }
};

int main(int argc, char** argv) {
  const bool q4a8 = atoi(argv[1]);
  const int T = atoi(argv[2]), repeats = atoi(argv[3]);
  const double mb = atof(argv[4]);
  const int regime = atoi(argv[5]);  // 0 l2, 1 stream, 2 stream on two threads
  const size_t bytes_per_panel_block = q4a8 ? kQ4BlockBytes : 32 * 16 + 32;
  if (regime == 0) {
    Matrix m(q4a8, 1536, 576);
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t = now();
      for (int it = 0; it < 20; ++it) m.sweep(T, 0, m.P);
      best = std::min(best, (now() - t) / 20);
    }
    printf("%.4f\n", 1e9 * best / (double(m.P) * m.nb));
    return 0;
  }
  const int in = 576 * 8, nb = in / 32;
  const int P = int(mb * 1e6 / (double(nb) * bytes_per_panel_block)) / 2 * 2;
  Matrix m(q4a8, P * 16, in);
  // the second thread waits spinning, as the engine's pool does: a thread started per sweep began ms late
  std::atomic<int> go{0}, done{0};
  std::thread other;
  if (regime == 2)
    other = std::thread([&] {
      for (int seen = 0; seen <= repeats; ++seen) {
        while (go.load(std::memory_order_acquire) == seen) _mm_pause();
        if (seen == repeats) return;
        m.sweep(T, P / 2, P);
        done.fetch_add(1, std::memory_order_release);
      }
    });
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double t = now();
    if (regime == 1) m.sweep(T, 0, P);
    else {
      go.store(r + 1, std::memory_order_release);
      m.sweep(T, 0, P / 2);
      while (done.load(std::memory_order_acquire) < r + 1) _mm_pause();
    }
    best = std::min(best, now() - t);
  }
  if (regime == 2) {
    go.store(repeats + 1, std::memory_order_release);
    other.join();
  }
  const double blocks = double(P) * nb / (regime == 2 ? 2 : 1);
  printf("%.4f\n", 1e9 * best / blocks);
  return 0;
}
"""

REGIMES = ["l2", "stream", "stream_2threads"]
FORMATS = {"q4_a8": 1, "int8": 0}


def build(tmp: Path) -> Path:
    src, exe = tmp / "tile_pace.cpp", tmp / "tile_pace"
    src.write_text(SOURCE)
    subprocess.run(["g++", "-O3", "-std=c++20", "-pthread", f"-I{CSRC}", "-o", str(exe), str(src)], check=True,
                   capture_output=True, text=True)
    return exe


def time_one(exe: Path, fmt: str, T: int, regime: str, repeats: int, stream_mb: float) -> float:
    out = subprocess.run([str(exe), str(FORMATS[fmt]), str(T), str(repeats), str(stream_mb),
                          str(REGIMES.index(regime))], check=True, capture_output=True, text=True).stdout
    return float(out)


def bench(args) -> dict:
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tile-pace-") as tmp:
        exe = build(Path(tmp))
        for r in range(args.rounds):
            ns = {}
            for fmt in args.formats:
                for T in args.rows:
                    for regime in REGIMES:
                        ns[fmt, T, regime] = time_one(exe, fmt, T, regime, args.repeats, args.stream_mb)
            rounds.append(dict(read_gb_s=measure_gbs("cpu"), ns=ns))
            print(r, {f"{k[0]} T{k[1]} {k[2]}": round(v, 2) for k, v in ns.items()}, flush=True)
    rows = []
    for fmt in args.formats:
        for T in args.rows:
            for regime in REGIMES:
                per = [rd["ns"][fmt, T, regime] for rd in rounds]
                over = [rd["ns"][fmt, T, regime] / rd["ns"][fmt, args.rows[0], regime] for rd in rounds]
                rows.append(dict(format=fmt, T=T, regime=regime, ns_per_block=statistics.median(per),
                                 ns_lo=min(per), ns_hi=max(per), over_T1=statistics.median(over)))
    return dict(rows=rows, rounds=args.rounds, repeats=args.repeats, stream_mb=args.stream_mb,
                read_gb_s=statistics.median(rd["read_gb_s"] for rd in rounds),
                raw=[dict(read_gb_s=rd["read_gb_s"], ns={"|".join(map(str, k)): v for k, v in rd["ns"].items()})
                     for rd in rounds])


def markdown(result: dict) -> str:
    head = (f"gemm.h's tiles alone (bench/tile_pace.py), ns a block of 16 outputs x 32 inputs for all T rows (tiles "
            f"of 8 rows at most): one thread in L2, one thread streaming {result['stream_mb']:.0f} MB, two threads "
            f"streaming a half each (per thread); the best of {result['repeats']} a round, the median over "
            f"{result['rounds']} rounds (lo, hi: the extremes); over_T1 against T = 1 in the same regime and round. "
            f"Read probe {result['read_gb_s']:.1f} GB/s (median over rounds).\n\n")
    return head + markdown_table(result["rows"], ["format", "T", "regime", "ns_per_block", "ns_lo", "ns_hi", "over_T1"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 6, 8, 16], help="T values; the first is the reference")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--stream-mb", type=float, default=96.0, help="weights streamed (the default model's: ~96 MB)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="tile-pace-cpu")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args), markdown)


if __name__ == "__main__":
    main()
