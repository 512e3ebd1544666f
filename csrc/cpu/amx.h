// q4 and q8 on AMX-INT8 tiles, against the 16-bit activations of q16.h. Include only from kernels_amx.cpp
// (compiled for AVX-512 + AMX-TILE/INT8, after simd_avx512.h); the host hands its table out only where the
// CPU has AMX and Linux granted the process the tile state (isa.cpp).
//
// Shape: a tile multiply is C[M x 16] += A[M x 32] . B[32 x 16]: 16 outputs a panel, the rows of a pass in A.
// Each block of 32 inputs has its own scales on both sides (d[n, b], dx[t, b]), so every block's int32 sums
// leave the tiles (TILESTORED) and go through fold_q4 / fold_q8, the very fold the VNNI tiles run: the same
// bits at every T and on every path. ggml runs its 32-blocks on AMX the same way (ggml-cpu/amx/mmq.cpp).
// The 16-bit activation is two int8 halves x16 = 256 hi + lo (q16.h), so two tile multiplies a block:
//   q4: C_hi = TDPBSSD(hi, q as signed 0..15), C_lo = TDPBUSD(lo unsigned, q);       S = 256 C_hi + C_lo
//   q8: C_hi = TDPBSUD(hi, q+128 unsigned),    C_lo = TDPBUUD(lo, q+128);            S = 256 C_hi + C_lo - 128 sum(x16)
// q4's nibbles are unpacked per panel into B tiles in an L1 scratch (a second row tile re-reads them there);
// q8's B tiles load straight from the weight stream.
//
// Cost: a TILESTORED costs ~16 cycles whatever its rows and the nibble unpack and the fold add to it, about
// 20 ns a block and panel, where a VNNI tile pays ~5 ns a row: the tiles win only past ~10 rows, so the
// table runs them from amx_min_rows() rows up (isa.h; bench/results has the crossover measured).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>

#include "gemm.h"
#include "q16.h"

namespace decodescope::cpu {
namespace {

struct Amx {
  using S = Avx512;
  using F = __m512;
  using I = __m512i;
  static constexpr int kChunk = 8;  // blocks per tile phase (see q4_panel)

  struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  };

  // Tiles 0, 1: C (hi, lo), M rows of 16 int32; 2, 3: A (hi, lo), M rows of 32 bytes; 4: B, 8 rows of 16 x 4
  // bytes. A thread loads the config at the start of each call and releases the tiles at its end: another
  // library on the same thread (oneDNN under torch) may load its own config in between, and released tiles
  // keep the thread's saved state small.
  static void configure(int m) {
    TileConfig c;
    c.rows[0] = c.rows[1] = c.rows[2] = c.rows[3] = static_cast<uint8_t>(m);
    c.colsb[0] = c.colsb[1] = 64;
    c.colsb[2] = c.colsb[3] = kBlock;
    c.rows[4] = kBlock / 4;
    c.colsb[4] = 64;
    // gcc 12's _tile_loadconfig tells the compiler it reads 8 bytes only: without the barrier the stores that
    // fill `c` may be dropped, and the first tile instruction faults
    __asm__ __volatile__("" ::: "memory");
    _tile_loadconfig(&c);
  }

  // Rows per A tile: at most 16, all row tiles of a pass the same height (T = 17: 9 + 9), so one config serves
  // the pass. Rows past T read the planes' padding (kAct16PadRows) and are never stored.
  static int tile_height(int rows) {
    const int tiles = (rows + 15) / 16;
    return (rows + tiles - 1) / tiles;
  }

  static void store_rows(const LinearArgs& a, int64_t p, int r0, int valid, const F* y) {
    for (int r = 0; r < valid; ++r) Gemm<S>::store_row(a, p, r0 + r, y[r]);
  }

  // A thread's scratch: [0, 16 KB) the C tiles of kChunk blocks, then q4's unpacked B tiles, 512 bytes a block.
  static uint8_t* scratch(int nb) {
    struct Buffer {
      uint8_t* p = nullptr;
      int64_t size = 0;
      ~Buffer() { std::free(p); }
    };
    static thread_local Buffer buf;
    const int64_t need = kChunk * 2 * 16 * kPanel * 4 + static_cast<int64_t>(nb) * 512;
    if (buf.size < need) {
      std::free(buf.p);
      buf.p = static_cast<uint8_t*>(std::aligned_alloc(64, need));
      buf.size = need;
    }
    return buf.p;
  }

  // B tiles of a q4 panel: block b's 8 rows of 64 bytes, row 2c = the low nibbles of chunk c, 2c + 1 the high.
  static void q4_unpack(const uint8_t* wp, int nb, uint8_t* tiles) {
    const I nib = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < nb; ++b) {
      const uint8_t* wb = wp + b * kQ4BlockBytes;
      for (int line = 0; line < kQ4BlockBytes; line += 64) prefetch(wb + line);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const I v = _mm512_loadu_si512(wb + c * kQ4Chunk);
        _mm512_store_si512(tiles + b * 512 + c * 128, _mm512_and_si512(v, nib));
        _mm512_store_si512(tiles + b * 512 + c * 128 + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
      }
    }
  }

  // The fold of blocks [b0, b1) of a row tile, their C tiles in cbuf. Not inlined, and no tile instruction
  // inside: GCC's tile intrinsics are asm with a memory clobber, and in the same loop as the fold they make it
  // keep the rows' accumulators in memory; here they stay in registers, one load and store a chunk.
  template <int M, bool kQ8>
  __attribute__((noinline)) static void fold(const LinearArgs& a, int64_t p, int r0, int b0, int b1,
                                             const int32_t* cbuf, F* yio) {
    const Act16& x = *a.act;
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * a.nb * kQ4BlockBytes;  // q4
    const uint16_t* d = a.d + p * a.nb * kPanel;                                     // q8
    F y[M];
    for (int r = 0; r < M; ++r) y[r] = yio[r];
    for (int b = b0; b < b1; ++b) {
      const int32_t* c = cbuf + (b - b0) * 2 * 16 * kPanel;
      F dv, mv;
      if constexpr (kQ8) {
        dv = S::load_f16(d + b * kPanel);
      } else {
        dv = S::load_f16(reinterpret_cast<const uint16_t*>(wp + b * kQ4BlockBytes + kQ4Nibbles));
        mv = S::load_f16(reinterpret_cast<const uint16_t*>(wp + b * kQ4BlockBytes + kQ4Nibbles + 2 * kPanel));
      }
#pragma GCC unroll 16
      for (int r = 0; r < M; ++r) {
        const int64_t s = (r0 + r) * a.nb + b;
        const I hi = _mm512_load_si512(c + r * kPanel), lo = _mm512_load_si512(c + (M + r) * kPanel);
        I sum = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
        if constexpr (kQ8) {
          sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * x.sum16[s]));
          y[r] = fold_q8<S>(y[r], S::to_float(sum), dv, x.dx[s]);
        } else {
          y[r] = fold_q4<S>(y[r], S::to_float(sum), dv, mv, x.dx[s], x.xs[s]);
        }
      }
    }
    for (int r = 0; r < M; ++r) yio[r] = y[r];
  }

  // One panel, all row tiles: blocks in chunks of kChunk, the tile phase (two multiplies and two stores a
  // block) then the fold phase.
  template <int M, bool kQ8>
  static void panel(const LinearArgs& a, int64_t p, uint8_t* buf) {
    const Act16& x = *a.act;
    int32_t* cbuf = reinterpret_cast<int32_t*>(buf);
    uint8_t* tiles = buf + kChunk * 2 * 16 * kPanel * 4;
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * a.nb * (kQ8 ? kBlock * kPanel : kQ4BlockBytes);
    if constexpr (!kQ8) q4_unpack(wp, a.nb, tiles);
    for (int r0 = 0; r0 < a.rows; r0 += M) {
      alignas(64) F y[M];
      for (int r = 0; r < M; ++r) y[r] = _mm512_setzero_ps();
      for (int b0 = 0; b0 < a.nb; b0 += kChunk) {
        const int b1 = b0 + kChunk < a.nb ? b0 + kChunk : a.nb;
        for (int b = b0; b < b1; ++b) {
          int32_t* c = cbuf + (b - b0) * 2 * 16 * kPanel;
          _tile_loadd(2, x.hi + r0 * x.ld + b * kBlock, x.ld);
          _tile_loadd(3, x.lo + r0 * x.ld + b * kBlock, x.ld);
          _tile_zero(0);
          _tile_zero(1);
          if constexpr (kQ8) {
            const uint8_t* qb = wp + b * kBlock * kPanel;
            for (int line = 0; line < kBlock * kPanel; line += 64) prefetch(qb + line);
            _tile_loadd(4, qb, 64);
            _tile_dpbsud(0, 2, 4);
            _tile_dpbuud(1, 3, 4);
          } else {
            _tile_loadd(4, tiles + b * 512, 64);
            _tile_dpbssd(0, 2, 4);
            _tile_dpbusd(1, 3, 4);
          }
          _tile_stored(0, c, 64);
          _tile_stored(1, c + M * kPanel, 64);
        }
        fold<M, kQ8>(a, p, r0, b0, b1, cbuf, y);
      }
      store_rows(a, p, r0, a.rows - r0 < M ? a.rows - r0 : M, y);
    }
  }

  template <bool kQ8, int M = 16>
  static void panels(int m, const LinearArgs& a, int64_t p0, int64_t p1, uint8_t* buf) {
    if constexpr (M >= 1) {
      if (m != M) return panels<kQ8, M - 1>(m, a, p0, p1, buf);
      for (int64_t p = p0; p < p1; ++p) panel<M, kQ8>(a, p, buf);
    }
  }

  template <bool kQ8>
  static void run(const LinearArgs& a, int64_t p0, int64_t p1) {
    const int m = tile_height(a.rows);
    uint8_t* buf = scratch(kQ8 ? 0 : a.nb);
    configure(m);
    panels<kQ8>(m, a, p0, p1, buf);
    _tile_release();
  }
  static void linear_q4(const LinearArgs& a, int64_t p0, int64_t p1) { run<false>(a, p0, p1); }
  static void linear_q8(const LinearArgs& a, int64_t p0, int64_t p1) { run<true>(a, p0, p1); }
};

}  // namespace
}  // namespace decodescope::cpu
