// The K-quant GEMMs (GGUF Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) over panels that are the file's blocks of 16 rows interleaved
// field by field (kernels.h; Q6_K's quant bits regrouped, q6k_group), against llama.cpp's Q8_K activations.
// Written once over a SIMD vocabulary S and compiled in each ISA's translation unit (gemm.h dispatches to them).
// Torch-free. Here: Q4_K / Q5_K's operands and the tiles every format runs; the formats with sub-blocks of 16 inputs
// (Q2_K, Q3_K, Q6_K) and the loop they share are kquants16.h's, what all of them share kquant_base.h's.
//
// The recipe is ggml's (arch/x86/quants.c ggml_vec_dot_q4_K_q8_K and friends), turned so that 16 outputs sit in
// the lanes: a 64-byte line of the panel holds 4 quant bytes of each of 16 rows, so one VPDPBUSD multiplies them
// by 4 int8 activations broadcast, 64 products an instruction. Per row and super-block of 256 the sums are exact
// integers (|isum| < 2^31 below), the sub-blocks' small scales and mins applied in int32, and one float fold
// per super-block remains:
//
//   q2_k, q4_k, q5_k: y += float(isum) fl(d dx) - float(imin) fl(dmin dx),  isum = sum_s sc_s sum_i q_i qx_i,
//               imin = sum_s mn_s xsum_s (the mins fold in through the activations' sums, no weight touched)
//   q3_k, q6_k: y += float(isum) fl(d dx),  isum = sum_s sc_s (sum_i (q_i + o) qx_i - o xsum_s), o = 4, 32
//
// (Q3_K's and Q6_K's quants are read as q + o, unsigned as VPDPBUSD wants them; the offset leaves through xsum.) The
// activations, 8 bits per 256 with one scale, cost about 0.65% of an output's size against fp32 on Gaussian
// inputs, as llama.cpp's. Decode reads 4.5-6.6 bits a weight: with VPDPBUSD (AVX-512 VNNI) memory bounds it, but
// on AVX2 cores VPMADDUBSW's integer work does (a Q4_K matrix resident in L3 ran at 43 GB/s, one streamed from
// memory at 27, the read probe 36), so there every instruction per super-block counts.
//
// A verify pass of more rows than a tile holds unpacks each super-block of a panel once (nibbles, high bits and
// scales into VPDPBUSD operands, 5.5 KB in L1) and every row tile of the pass reads it: the unpacking is per
// panel, not per tile (Q6_K's costs a row about as much as its dot products on AVX2, whose tiles are 2 rows).
//
// Batch invariance: the integers are exact whichever ISA, tile or thread computed them, and the fold runs per
// (row, output) in super-block order from y = +0, so a row's outputs are the same bits at every T and path.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "kernels.h"
#include "kquant_base.h"
#include "kquants16.h"
#include "prefetch.h"
#include "q16.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct KQuants : KQuants16<S> {
  using B = KQuants16<S>;
  using typename B::F;
  using typename B::I;
  using typename B::U8;
  using typename B::Unpacked;
  using typename B::Q2;
  using typename B::Q3;
  using typename B::Q6;
  using B::bit_to;
  using B::fold_mins;
  using B::kRows;
  using B::nibbles;
  using B::store_row;
  using B::x4;

  // Q4_K / Q5_K's 12 bytes of 6-bit scales and mins of 16 rows (byte k of row j at p[16k + j]; ggml's
  // get_scale_min_k4) worked on as bytes, 16 rows x 2 sub-blocks to a 32-byte vector, then widened once into
  // what the loop uses: ss[s] the scale of sub-block s as S::sub_scaled takes it, mn[t] the mins of sub-blocks
  // 2t and 2t + 1 as int16 pairs for S::min_dot. Every ISA here has AVX2, so the byte work is written once.
  // (Unpacking each byte into an int32 lane first took about a quarter of a Q4_K super-block's instructions.)
  static void scales_q4k(const uint8_t* p, typename S::SubScale* ss, I* mn) {
    const __m256i m63 = _mm256_set1_epi8(63), m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(0x30);
    const auto load = [p](int at) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + at)); };
    for (int k = 0; k < 2; ++k) {  // sub-blocks 2k, 2k + 1 and 4 + 2k, 5 + 2k
      const __m256i a = load(32 * k), m = load(64 + 32 * k), h = load(128 + 32 * k);
      // (v >> 6) << 4 of each byte as (v >> 2) & 0x30 in 16-bit lanes: the mask drops the neighbour's bits
      const __m256i sc_lo = _mm256_and_si256(a, m63), mn_lo = _mm256_and_si256(m, m63);
      const __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(h, m15), _mm256_and_si256(_mm256_srli_epi16(a, 2), m48));
      const __m256i mn_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(h, 4), m15),
                                            _mm256_and_si256(_mm256_srli_epi16(m, 2), m48));
      S::sub_scales(sc_lo, ss[2 * k], ss[2 * k + 1]);
      S::sub_scales(sc_hi, ss[4 + 2 * k], ss[5 + 2 * k]);
      mn[k] = S::min_pairs(mn_lo);
      mn[2 + k] = S::min_pairs(mn_hi);
    }
  }

  // Where a Q4_K / Q5_K super-block's quant lines start in its panel (after d, dmin, the scales and Q5_K's
  // high bits), and Q5_K's high-bit lines.
  static constexpr int q45k_quants(bool high) { return high ? 768 : 256; }
  static constexpr int kQh = 256;

  // Q4_K (High = false) and Q5_K (High = true). In the file each 32 quant bytes hold sub-block 2i in their low
  // nibbles and 2i + 1 in their high ones (inputs 64i + l and 64i + 32 + l of byte l), so a 64-byte group g of
  // pair i feeds both: inputs 64i + 4g.. and 64i + 32 + 4g... Q5_K's fifth bit of those inputs is bit 2i and
  // 2i + 1 of the high-bit group g.
  template <bool High>
  static void q45k_group(const uint8_t* wb, int i, int g, U8& wl, U8& wh) {
    constexpr int kQs = q45k_quants(High);
    const U8 q = S::u8_load(wb + kQs + (8 * i + g) * 64);
    nibbles(q, wl, wh);
    if constexpr (High) {
      const U8 h = S::u8_load(wb + kQh + g * 64);
      wl = S::u8_or(wl, bit_to(h, 2 * i, 4, 1));
      wh = S::u8_or(wh, bit_to(h, 2 * i + 1, 4, 1));
    }
  }

  template <bool High>
  static void q45k_unpack(const uint8_t* wb, Unpacked& u) {
    scales_q4k(wb + 64, u.sc, u.mn);
    for (int i = 0; i < 4; ++i)
      for (int g = 0; g < 8; ++g) q45k_group<High>(wb, i, g, u.w[2 * (8 * i + g)], u.w[2 * (8 * i + g) + 1]);
  }

  // Rows r0.. (R of them) of one super-block sb, folded into y[0..R).
  template <int R, bool High, bool Stored>
  static void q45k_rows(const LinearArgs& a, const uint8_t* wb, const Unpacked* u, int sb, int64_t r0, F* y) {
    const int ns = (a.in + kSuper - 1) / kSuper;
    const int64_t ldq = static_cast<int64_t>(ns) * kSuper;
    typename S::SubScale ssd[8];
    I mnd[4];
    if constexpr (!Stored) scales_q4k(wb + 64, ssd, mnd);
    const typename S::SubScale* ss = Stored ? u->sc : ssd;
    const I* mn = Stored ? u->mn : mnd;
    // groups one Sub holds exactly: a lane's pair sums are at most 2 * wmax * 128 each
    constexpr int kFit = S::kSubSum / (2 * (High ? 31 : 15) * 128), kG = kFit < 8 ? kFit : 8;
    static_assert(kG >= 1 && 8 % kG == 0);
    I isum[R];
    for (int r = 0; r < R; ++r) isum[r] = S::i32_zero();
    for (int i = 0; i < 4; ++i) {
#pragma GCC unroll 2
      for (int g0 = 0; g0 < 8; g0 += kG) {
        typename S::Sub lo[R], hi[R];
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = S::sub_zero();
#pragma GCC unroll 8
        for (int g = g0; g < g0 + kG; ++g) {
          U8 wl, wh;
          if constexpr (Stored) wl = u->w[2 * (8 * i + g)], wh = u->w[2 * (8 * i + g) + 1];
          else {
            B::template stream_line<High ? kQ5KBytes : kQ4KBytes>(wb + q45k_quants(High) + (8 * i + g) * 64);
            q45k_group<High>(wb, i, g, wl, wh);
          }
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = a.qx + (r0 + r) * ldq + sb * kSuper + 64 * i + 4 * g;
            lo[r] = S::sub_dot(lo[r], wl, x4(xr));
            hi[r] = S::sub_dot(hi[r], wh, x4(xr + 32));
          }
        }
        for (int r = 0; r < R; ++r)
          isum[r] = S::i32_add(isum[r],
                               S::i32_add(S::sub_scaled(lo[r], ss[2 * i]), S::sub_scaled(hi[r], ss[2 * i + 1])));
      }
    }
    const F d = S::load_f16(reinterpret_cast<const uint16_t*>(wb));
    const F dmin = S::load_f16(reinterpret_cast<const uint16_t*>(wb + 32));
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const I imin = B::template pair_dot<4>(mn, a.xpair + (row * ns + sb) * kXPairs + kXPair32);
      y[r] = fold_mins(y[r], isum[r], imin, d, dmin, S::set1(a.dx[row * ns + sb]));
    }
  }

  // One format's unpack and rows (Bits: 2, 3, 4, 5 or 6).
  template <int Bits>
  static void unpack(const uint8_t* wb, Unpacked& u) {
    if constexpr (Bits == 2) B::template unpack16<Q2>(wb, u);
    else if constexpr (Bits == 3) B::template unpack16<Q3>(wb, u);
    else if constexpr (Bits == 6) B::template unpack16<Q6>(wb, u);
    else q45k_unpack<Bits == 5>(wb, u);
  }
  template <int Bits, int R, bool Stored>
  static void rows(const LinearArgs& a, const uint8_t* wb, const Unpacked* u, int sb, int64_t r0, F* y) {
    if constexpr (Bits == 2) B::template rows16<R, Stored, Q2>(a, wb, u, sb, r0, y);
    else if constexpr (Bits == 3) B::template rows16<R, Stored, Q3>(a, wb, u, sb, r0, y);
    else if constexpr (Bits == 6) B::template rows16<R, Stored, Q6>(a, wb, u, sb, r0, y);
    else q45k_rows<R, Bits == 5, Stored>(a, wb, u, sb, r0, y);
  }
  static constexpr int bytes(int bits) {
    return bits == 2 ? kQ2KBytes : bits == 3 ? kQ3KBytes : bits == 4 ? kQ4KBytes : bits == 5 ? kQ5KBytes : kQ6KBytes;
  }
  // A super-block's bytes before its quant lines (its scales and d; Q4_K and Q5_K's dmin, Q5_K's high bits, read
  // by every pair), which a tile asks for at the super-block's start; the quant lines are asked for one group at
  // a time as the rows read them. Q2_K's d and dmin, the file's last 64 bytes, are its one line after them.
  static constexpr int head_bytes(int bits) {
    return bits == 2 ? kQ2Quants : bits == 3 ? kQ3Quants : bits == 6 ? kQ6Quants : q45k_quants(bits == 5);
  }

  // A tile of R rows of panel p, unpacking as it goes: a pass of at most kRows rows (a decode step).
  template <int Bits, int R>
  static void tile(const LinearArgs& a, int64_t p, int r0) {
    const int ns = (a.in + kSuper - 1) / kSuper;
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * ns * bytes(Bits);
    F y[R];
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int sb = 0; sb < ns; ++sb) {
      const uint8_t* wb = wp + static_cast<int64_t>(sb) * bytes(Bits);
      for (int line = 0; line < head_bytes(Bits); line += 64) B::template stream_line<bytes(Bits)>(wb + line);
      if constexpr (Bits == 2) B::template stream_line<bytes(Bits)>(wb + kQ2D);
      rows<Bits, R, false>(a, wb, nullptr, sb, r0, y);
    }
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // rows<Bits, n, true> for the runtime n in [1, R].
  template <int Bits, int R>
  static void stored_rows(int n, const LinearArgs& a, const uint8_t* wb, const Unpacked* u, int sb, int64_t r0,
                          F* y) {
    if constexpr (R >= 1) {
      if (n == R) return rows<Bits, R, true>(a, wb, u, sb, r0, y);
      stored_rows<Bits, R - 1>(n, a, wb, u, sb, r0, y);
    }
  }

  // Panels [p0, p1) for a pass of more rows than a tile holds: each super-block of a panel is unpacked once for
  // the rows of a chunk (kChunk rows, their outputs in a buffer), then every tile of the chunk reads it. The
  // fold of a (row, output) is the tile's, in super-block order from +0: the same bits as tile().
  static constexpr int kChunk = 64;
  template <int Bits>
  static void shared(const LinearArgs& a, int64_t p0, int64_t p1) {
    const int ns = (a.in + kSuper - 1) / kSuper;
    Unpacked u;
    F y[kChunk];
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * ns * bytes(Bits);
      for (int c0 = 0; c0 < a.rows; c0 += kChunk) {
        const int n = a.rows - c0 < kChunk ? a.rows - c0 : kChunk;
        for (int r = 0; r < n; ++r) y[r] = S::zero();
        for (int sb = 0; sb < ns; ++sb) {
          const uint8_t* wb = wp + static_cast<int64_t>(sb) * bytes(Bits);
          for (int line = 0; line < bytes(Bits); line += 64) prefetch(wb + line);
          unpack<Bits>(wb, u);
          for (int r0 = 0; r0 < n; r0 += kRows)
            stored_rows<Bits, kRows>(n - r0 < kRows ? n - r0 : kRows, a, wb, &u, sb, c0 + r0, y + r0);
        }
        for (int r = 0; r < n; ++r) store_row(a, p, c0 + r, y[r]);
      }
    }
  }

  // The K-quant GEMM of panels [p0, p1): tiles that unpack as they go for a pass of at most kRows rows, else
  // each super-block unpacked once for all the rows.
  template <int Bits>
  static void linear(const LinearArgs& a, int64_t p0, int64_t p1) {
    if (a.rows > kRows) return shared<Bits>(a, p0, p1);
    for (int64_t p = p0; p < p1; ++p) tile_n<Bits, kRows>(a.rows, a, p);
  }
  template <int Bits, int R>
  static void tile_n(int n, const LinearArgs& a, int64_t p) {
    if constexpr (R >= 1) {
      if (n == R) return tile<Bits, R>(a, p, 0);
      tile_n<Bits, R - 1>(n, a, p);
    }
  }

  // Q8_K, the recipe of engine/ops/ref.py quantize_blocks(x, in_pad, 127, 256) bit for bit: per row and
  // super-block of 256, inv = 127 / amax and dx = amax / 127 in scalar fp32, qx = round_half_even(x * inv), with
  // q16.h block_scales's rules for inf / NaN (zeros, dx = NaN) and for blocks too small to scale (zeros, dx = 0);
  // x past `in` counts as 0. xpair: the sums of every 16 qx (exact), through one sum tree (S::hsum16) rather than 16
  // horizontal sums, paired as every format's tile takes them (kernels.h kXPairs); the inf / NaN test one lane
  // check of v * 0 summed, not a horizontal sum per block.
  static int32_t int16_pair(int32_t lo, int32_t hi) {
    return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
  }
  static void quantize_rows_k(const float* x, int64_t ldx, int in, int ns, int8_t* qx, float* dx, int32_t* xpair,
                              int64_t r0, int64_t r1) {
    constexpr int kVecs = kSuper / 16;
    static_assert(kVecs == 16, "one hsum16 per super-block");
    for (int64_t r = r0; r < r1; ++r) {
      for (int sb = 0; sb < ns; ++sb) {
        F v[kVecs], q[kVecs];
        F zeros = S::zero();  // NaN in a lane where some value was inf or NaN (0 * inf = NaN)
        for (int k = 0; k < kVecs / 2; ++k) {
          load_block<S>(x + r * ldx, in, sb * (kSuper / kBlock) + k, v[2 * k], v[2 * k + 1]);
          zeros = S::add(zeros, S::add(S::mul(v[2 * k], S::zero()), S::mul(v[2 * k + 1], S::zero())));
        }
        const bool bad = S::ge_bits(zeros, zeros) != 0xFFFFu;  // NaN compares false
        F m = S::abs(v[0]);
        for (int k = 1; k < kVecs; ++k) m = S::max(m, S::abs(v[k]));
        const float amax = S::reduce_max(m), inv = 127.f / amax;
        float scale = 0.f, d = 0.f;
        if (bad) d = NAN;
        else if (inv <= FLT_MAX) scale = inv, d = amax / 127.f;
        const int64_t s = r * ns + sb;
        for (int k = 0; k < kVecs; ++k) {
          q[k] = S::round(S::mul(bad ? S::zero() : v[k], S::set1(scale)));
          S::store_i8(qx + s * kSuper + 16 * k, q[k]);
        }
        alignas(64) float sums[kVecs];
        S::store(sums, S::hsum16(q));  // exact: |sum| <= 16 * 127
        int32_t xs[kVecs];
        for (int k = 0; k < kVecs; ++k) xs[k] = static_cast<int32_t>(sums[k]);
        int32_t* xp = xpair + s * kXPairs;
        for (int t = 0; t < 4; ++t)
          xp[kXPair32 + t] = int16_pair(xs[4 * t] + xs[4 * t + 1], xs[4 * t + 2] + xs[4 * t + 3]);
        for (int t = 0; t < 8; ++t) xp[kXPairNext + t] = int16_pair(xs[2 * t], xs[2 * t + 1]);
        for (int t = 0; t < 8; ++t) xp[kXPairHalf + t] = int16_pair(xs[t], xs[t + 8]);
        dx[s] = d;
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
