// What the K-quant kernels share (kquants.h, kquants16.h; legacy.h's Q4_0 / Q5_0 tiles use its row store and
// activation loads): the tile's row count, the panel stream's prefetch, 4-byte activation loads, the row store,
// nibble and bit moves, and the unpacked super-block a verify pass shares across its tiles. Written once over a
// SIMD vocabulary S; torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "prefetch.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct KQuantBase {
  using F = typename S::F;
  using I = typename S::I;
  using U8 = typename S::U8;
  // Rows per tile: two sub-blocks' sums and the super-block's per row, plus the weights, in the register file.
  static constexpr int kRows = S::kRegs == 32 ? 6 : 2;

  // A tile (a decode step's pass) asks for each line of a super-block as it reads it: into L2 kPrefetch bytes
  // ahead (prefetch.h), and into L1 the same line of the panel's next super-block, Bytes on. Asked for in
  // the reading order, spread through the super-block's work, the requests keep the core's miss buffers
  // evenly busy: all of a super-block's lines asked for at its start (72 requests, then ~250 cycles without
  // one) streamed Q4_K at 10-15 GB/s where this does 13-19 (2 threads, an AVX2 EPYC with its memory slow).
  template <int Bytes>
  static void stream_line(const uint8_t* line) {
    prefetch(line);
    prefetch_l1(line + Bytes);
  }

  static int32_t x4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }

  static void store_row(const LinearArgs& a, int64_t p, int row, F v) {
    float* dst = a.y + row * a.ldy + p * kPanel;
    const int64_t left = a.n_out - p * kPanel;
    if (left >= kPanel) S::store(dst, v);
    else S::store_n(dst, v, static_cast<int>(left));  // padded outputs are never written
  }

  // A byte's low and high nibbles as two vectors of bytes 0..15. The high ones masked before the (16-bit) shift, so
  // no bit crosses into the byte below, and both ANDs read q itself: on a core with 128-bit SIMD halves (a Zen 1
  // EPYC) a Q4_K tile from L2 ran 3-4% quicker than with the shift first (one thread, 1024 x 1536).
  static void nibbles(U8 q, U8& lo, U8& hi) {
    lo = S::u8_and(q, 15);
    hi = S::u8_shr(S::u8_and(q, 0xF0), 4);
  }

  // sum_t pairs[t] . xp[t] over N int16 pairs: a super-block's sum_s m_s xsum_s, the scales or mins m_s paired as
  // the format's scales function pairs them, the activations' sums as quantize_rows_k pairs them (kernels.h
  // kXPairs, xp at the format's pairing).
  template <int N>
  static I pair_dot(const I* pairs, const int32_t* xp) {
    I acc = S::i32_zero();
    for (int t = 0; t < N; ++t) acc = S::min_dot(acc, pairs[t], xp[t]);
    return acc;
  }

  // y + float(isum) fl(d dx) - float(imin) fl(dmin dx): a super-block's fold for the formats with mins (Q2_K, Q4_K,
  // Q5_K), in engine/ops/ref.py linear_q8_k's order.
  static F fold_mins(F y, I isum, I imin, F d, F dmin, F dx) {
    y = S::fma(S::to_float(isum), S::mul(d, dx), y);
    return S::fnma(S::to_float(imin), S::mul(dmin, dx), y);
  }

  // Bit k of every byte moved to bit `to` (the rest zero).
  static U8 bit_to(U8 v, int k, int to, int width) {
    const int mask = ((1 << width) - 1) << to;
    return S::u8_and(k <= to ? S::u8_shl(v, to - k) : S::u8_shr(v, k - to), mask);
  }

  // A super-block of a panel with its quants unpacked into VPDPBUSD operands (lane j row j) and its scales (and
  // mins) into int32 lanes: a pass of more rows than a tile holds unpacks each super-block once for all its
  // tiles (Stored), a tile of the rows there are unpacks as it goes (Direct). Both give the tile the same
  // operands, so the same integers. w: Q4_K / Q5_K [pair i][group g][low, high]; Q6_K [h][ab][group g][k = ab, ab + 2];
  // Q2_K, Q3_K [n][jp / 2][group g][j = jp, jp + 1].
  static_assert(std::is_same_v<typename S::SubScale, I>);
  struct Unpacked {
    U8 w[64];
    I sc[16];  // the sub-blocks' SubScales (S::SubScale is I everywhere): Q4_K / Q5_K 8, Q2_K / Q3_K / Q6_K 16
    I mn[8];   // Q4_K / Q5_K: the mins as scales_q4k gives them (4); Q2_K the mins, Q3_K / Q6_K the scales as pairs (8)
  };
};

}  // namespace
}  // namespace decodescope::cpu
