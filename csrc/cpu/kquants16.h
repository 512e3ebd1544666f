// The K-quants whose sub-blocks are 16 inputs (GGUF Q2_K, Q3_K, Q6_K): each format's operands and scales as its
// panels hold them, and the quarter loop the three share, which sums a super-block's rows exactly in int32 and
// folds them once (kquants.h: the recipe, and the tiles that call rows16 / unpack16). Written once over a SIMD
// vocabulary S; torch-free.
#pragma once

#include <cstdint>

#include <immintrin.h>

#include "kernels.h"
#include "kquant_base.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct KQuants16 : KQuantBase<S> {
  using B = KQuantBase<S>;
  using typename B::F;
  using typename B::I;
  using typename B::U8;
  using typename B::Unpacked;
  using B::bit_to;
  using B::fold_mins;
  using B::x4;

  // Q6_K. In the file each half h of 128 inputs has 64 ql bytes (A = bytes 0-31, B = 32-63) and 32 qh bytes:
  // inputs 128h + 32k + l take A's low, B's low, A's high, B's high nibble (k = 0..3) of byte l and bits 2k, 2k+1
  // of qh[l]. The panels hold those bits moved (engine/weights/k_placed.py place_q6_k): for the 4 bytes l = 4g..
  // of 16 rows, line X (kernels.h q6k_x_at) holds q0 | q3's bits 0-1 << 6, Y q1 | bits 2-3 << 6 and Z q2 |
  // bits 4-5 << 6, q_k the 6-bit quant of input 128h + 32k + l, the lines in the order read here. So a
  // group g of k = ab and ab + 2 is X and Z under one AND each (ab = 0), or Y under one and q3 gathered from the
  // three top pairs (ab = 1): 11 instructions for the four quants where the file's nibbles and pairs took 18.
  // Sub-block 8h + 2k + gg (16 inputs) is groups g = 4gg..4gg+3.
  static void q6k_group(const uint8_t* wb, int h, int ab, int g, U8& wl, U8& wh) {
    const U8 x = S::u8_load(wb + q6k_x_at(h, g)), z = S::u8_load(wb + q6k_z_at(h, g));
    if (ab == 0) {
      wl = S::u8_and(x, 63), wh = S::u8_and(z, 63);
      return;
    }
    const U8 y = S::u8_load(wb + q6k_y_at(h, g));
    wl = S::u8_and(y, 63);
    wh = S::u8_or(S::u8_or(S::u8_and(S::u8_shr(x, 6), 3), S::u8_and(S::u8_shr(y, 4), 12)),
                  S::u8_and(S::u8_shr(z, 2), 48));
  }

  // Q6_K's 16 int8 scales of 16 rows (sub-block s at p[16s + j]) as S::sub_scaled takes them, and as int16
  // pairs (sub-blocks 2t, 2t + 1) for the offset's sum: the same byte-level path as scales_q4k, sign-extended.
  static void scales_q6k(const uint8_t* p, typename S::SubScale* ss, I* pairs) {
    for (int t = 0; t < 8; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * t));
      S::template sub_scales<true>(v, ss[2 * t], ss[2 * t + 1]);
      pairs[t] = S::template min_pairs<true>(v);
    }
  }

  // Q3_K, placed (kernels.h kQ3*, q3k_x_at): the quants q(n, j) + 4 (0..7) of inputs 128n + 32j + 4g.. of 16 rows,
  // sub-block 8n + 2j + (g >= 4), from group g's X, Z and Y lines. The operands of j = JP, JP + 1 of half N: q(0,0),
  // q(0,1) from X; q(0,2) from X's top pair and Z's bit 6, q(0,3) from Z; q(1,0), q(1,1) from Y; q(1,2) from Y's
  // top pair and Z's bit 7, q(1,3) from Z.
  template <int N, int JP>
  static void q3k_operands(const uint8_t* wb, int g, U8& wl, U8& wh) {
    const U8 z = S::u8_load(wb + q3k_z_at(g));
    const U8 v = S::u8_load(wb + (N == 0 ? q3k_x_at(g) : q3k_y_at(g)));
    if constexpr (JP == 0) {
      wl = S::u8_and(v, 7), wh = bit_to(v, 3, 0, 3);
    } else {
      wl = S::u8_or(bit_to(v, 6, 0, 2), bit_to(z, 6 + N, 2, 1));
      wh = N == 0 ? S::u8_and(z, 7) : bit_to(z, 3, 0, 3);
    }
  }

  // Q3_K's 12 scale bytes of 16 rows (byte k of row j at p[16k + j]; ggml's dequantize_row_q3_K) as S::sub_scaled
  // takes them (ss[s]: sc - 32) and as int16 pairs of sub-blocks s, s + 8 (pairs[s]) for the offset's sum. Scale
  // s's low 4 bits are byte s % 8's low nibble (s < 8) or high one, its high 2 bits 2 (s / 4), 2 (s / 4) + 1 of
  // byte 8 + s % 4: s and s + 8 share both bytes, so they are made side by side in one 32-byte vector.
  static void scales_q3k(const uint8_t* p, typename S::SubScale* ss, I* pairs) {
    const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(0x30), m32 = _mm256_set1_epi8(32);
    for (int s = 0; s < 8; ++s) {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * s));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * (8 + s % 4)));
      const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(lo, 4), lo), m15);
      // the high pair of s (bits 0-1 or 2-3) and of s + 8 (bits 4-5 or 6-7) moved to bits 4-5, the mask dropping
      // what the 16-bit shifts carry across bytes
      const __m128i top_s = s < 4 ? _mm_slli_epi16(hi, 4) : _mm_slli_epi16(hi, 2);
      const __m128i top_s8 = s < 4 ? hi : _mm_srli_epi16(hi, 2);
      const __m256i top = _mm256_and_si256(_mm256_set_m128i(top_s8, top_s), m48);
      const __m256i v = _mm256_sub_epi8(_mm256_or_si256(nib, top), m32);
      S::template sub_scales<true>(v, ss[s], ss[s + 8]);
      ss[s] = S::sub_scale16(ss[s]), ss[s + 8] = S::sub_scale16(ss[s + 8]);  // for sub_scaled16 (Q3::scaled)
      pairs[s] = S::template min_pairs<true>(v);
    }
  }

  // Q2_K, the file's own panels (kernels.h kQ2*): the quants q(n, j) (0..3) of inputs 128n + 32j + 4g.. of 16 rows
  // are bits 2j, 2j + 1 of the qs line of half n, group g (sub-block 8n + 2j + (g >= 4)): the operands of j = JP,
  // JP + 1 are two fields of one line.
  template <int N, int JP>
  static void q2k_operands(const uint8_t* wb, int g, U8& wl, U8& wh) {
    const U8 v = S::u8_load(wb + q2k_at(N, g));
    wl = JP == 0 ? S::u8_and(v, 3) : bit_to(v, 2 * JP, 0, 2);
    wh = bit_to(v, 2 * JP + 2, 0, 2);
  }

  // Q2_K's 16 scale bytes of 16 rows (sub-block s at p[16s + j]: its scale in the low nibble, its min in the high
  // one) as S::sub_scaled16 takes the scales (ss[s]) and as int16 pairs of sub-blocks 2t, 2t + 1 (mins[t]).
  static void scales_q2k(const uint8_t* p, typename S::SubScale* ss, I* mins) {
    const __m256i m15 = _mm256_set1_epi8(15);
    for (int t = 0; t < 8; ++t) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * t));
      S::sub_scales(_mm256_and_si256(v, m15), ss[2 * t], ss[2 * t + 1]);
      ss[2 * t] = S::sub_scale16(ss[2 * t]), ss[2 * t + 1] = S::sub_scale16(ss[2 * t + 1]);
      mins[t] = S::min_pairs(_mm256_and_si256(_mm256_srli_epi16(v, 4), m15));
    }
  }

  // Q6_K, Q3_K and Q2_K, whose sub-blocks are 16 inputs, as quarter() reads them: a quarter q (0..3) of a
  // super-block is 8 groups g of 4 inputs of 16 rows, each giving two operands (Unpacked.w[2 (8q + g)] and the
  // next): the low one of sub-block sub0(q) + (g >= 4) at inputs x0(q) + 4g, the high one of that + kHiSub at
  // x0(q) + kXHi + 4g.
  // Fmt::kMins: the format has mins (Q2_K: scaled by dmin at kDMin), else its quants' offset is 2^kShift.
  struct Q6 {  // q = 2h + ab: half h, k = ab (low) and ab + 2 (high)
    static constexpr int kMax = 63, kHiSub = 4, kXHi = 64, kD = kQ6D, kShift = 5;
    static constexpr bool kMins = false;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* pairs) { scales_q6k(wb + kQ6Scales, ss, pairs); }
    static constexpr int kXPair = kXPairNext;  // scales_q6k's pairs: sub-blocks 2t, 2t + 1
    static constexpr int sub0(int q) { return 8 * (q / 2) + 2 * (q % 2); }
    static constexpr int x0(int q) { return 128 * (q / 2) + 32 * (q % 2); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q6k_group(wb, Q / 2, Q % 2, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // X and Z, then Y at ab = 1: each of the 48 lines asked for once
      if constexpr (Q % 2 == 0) {
        B::template stream_line<kQ6KBytes>(wb + q6k_x_at(Q / 2, g));
        B::template stream_line<kQ6KBytes>(wb + q6k_z_at(Q / 2, g));
      } else {
        B::template stream_line<kQ6KBytes>(wb + q6k_y_at(Q / 2, g));
      }
    }
    static I scaled(typename S::Sub acc, typename S::SubScale sc) { return S::sub_scaled(acc, sc); }
  };
  struct Q3 {  // q = 2n + jp / 2: half n, j = jp (low) and jp + 1 (high)
    static constexpr int kMax = 7, kHiSub = 2, kXHi = 32, kD = kQ3D, kShift = 2;
    static constexpr bool kMins = false;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* pairs) { scales_q3k(wb + kQ3Scales, ss, pairs); }
    static constexpr int kXPair = kXPairHalf;  // scales_q3k's pairs: sub-blocks t, t + 8
    static constexpr int sub0(int q) { return 8 * (q / 2) + 4 * (q % 2); }
    static constexpr int x0(int q) { return 128 * (q / 2) + 64 * (q % 2); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q3k_operands<Q / 2, 2 * (Q % 2)>(wb, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // each of the 24 lines once, at its first use: X, Z, then Y
      if constexpr (Q % 2 == 0) B::template stream_line<kQ3KBytes>(wb + (Q == 0 ? q3k_x_at(g) : q3k_y_at(g)));
      else if constexpr (Q == 1) B::template stream_line<kQ3KBytes>(wb + q3k_z_at(g));
    }
    // a sub-block's sums fit int16 (16 inputs x 7 x 127): VPMADDWD, not VPMULLD
    static I scaled(typename S::Sub acc, typename S::SubScale sc) { return S::sub_scaled16(acc, sc); }
  };
  struct Q2 {  // as Q3: q = 2n + jp / 2, half n, j = jp (low) and jp + 1 (high)
    static constexpr int kMax = 3, kHiSub = 2, kXHi = 32, kD = kQ2D, kDMin = kQ2DMin;
    static constexpr bool kMins = true;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* mins) { scales_q2k(wb + kQ2Scales, ss, mins); }
    static constexpr int kXPair = kXPairNext;  // scales_q2k's pairs: sub-blocks 2t, 2t + 1
    static constexpr int sub0(int q) { return Q3::sub0(q); }
    static constexpr int x0(int q) { return Q3::x0(q); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q2k_operands<Q / 2, 2 * (Q % 2)>(wb, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // each of the 16 lines once, at its first use
      if constexpr (Q % 2 == 0) B::template stream_line<kQ2KBytes>(wb + q2k_at(Q / 2, g));
    }
    // a sub-block's sums fit int16 (16 inputs x 3 x 127)
    static I scaled(typename S::Sub acc, typename S::SubScale sc) { return S::sub_scaled16(acc, sc); }
  };

  template <class Fmt, int Q = 0>
  static void unpack_quarters(const uint8_t* wb, Unpacked& u) {
    for (int g = 0; g < 8; ++g) Fmt::template operands<Q>(wb, g, u.w[2 * (8 * Q + g)], u.w[2 * (8 * Q + g) + 1]);
    if constexpr (Q < 3) unpack_quarters<Fmt, Q + 1>(wb, u);
  }

  // Quarter Q of a super-block for R rows, its sums added into isum.
  template <int R, bool Stored, class Fmt, int Q>
  __attribute__((always_inline)) static void quarter(const LinearArgs& a, const uint8_t* wb, const Unpacked* u,
                                                     const typename S::SubScale* ss, int sb, int64_t r0, I* isum) {
    const int ns = (a.in + kSuper - 1) / kSuper;
    const int64_t ldq = static_cast<int64_t>(ns) * kSuper;
    // groups one Sub holds exactly (a lane's pair sums at most 2 * kMax * 128 each), at most a sub-block's 4
    constexpr int kFit = S::kSubSum / (2 * Fmt::kMax * 128), kG = kFit < 4 ? kFit : 4;
    static_assert(kG >= 1 && 4 % kG == 0);
    I sum[R];
    for (int r = 0; r < R; ++r) sum[r] = isum[r];
#pragma GCC unroll 2
    for (int gg = 0; gg < 2; ++gg) {
      const int sub = Fmt::sub0(Q) + gg;
#pragma GCC unroll 4
      for (int g0 = 4 * gg; g0 < 4 * gg + 4; g0 += kG) {
        typename S::Sub lo[R], hi[R];
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = S::sub_zero();
#pragma GCC unroll 4
        for (int g = g0; g < g0 + kG; ++g) {
          U8 wl, wh;
          if constexpr (Stored) wl = u->w[2 * (8 * Q + g)], wh = u->w[2 * (8 * Q + g) + 1];
          else {
            Fmt::template stream<Q>(wb, g);
            Fmt::template operands<Q>(wb, g, wl, wh);
          }
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = a.qx + (r0 + r) * ldq + sb * kSuper + Fmt::x0(Q) + 4 * g;
            lo[r] = S::sub_dot(lo[r], wl, x4(xr));
            hi[r] = S::sub_dot(hi[r], wh, x4(xr + Fmt::kXHi));
          }
        }
        for (int r = 0; r < R; ++r)
          sum[r] = S::i32_add(sum[r],
                              S::i32_add(Fmt::scaled(lo[r], ss[sub]), Fmt::scaled(hi[r], ss[sub + Fmt::kHiSub])));
      }
    }
    for (int r = 0; r < R; ++r) isum[r] = sum[r];
  }
  // A pass of more than 2 rows runs each quarter as a function of its own: with a whole super-block's 32 groups in
  // one body GCC held the 24 scale vectors in registers and spilled the rows' sums around every VPDPBUSD (a 6-row
  // Q3_K tile ran at 1.97x one row's time; Q6_K's moved 475 vectors through the stack a tile), and a quarter is
  // Q4_K's loop body's size. One or two rows leave registers to spare, and there one body streamed Q6_K from
  // DRAM 1.24x quicker than four calls (kernels_ab, 8 rounds).
  template <int R, bool Stored, class Fmt, int Q>
  __attribute__((noinline)) static void quarter_call(const LinearArgs& a, const uint8_t* wb, const Unpacked* u,
                                                     const typename S::SubScale* ss, int sb, int64_t r0, I* isum) {
    quarter<R, Stored, Fmt, Q>(a, wb, u, ss, sb, r0, isum);
  }
  template <int R, bool Stored, class Fmt, int Q = 0>
  static void quarters(const LinearArgs& a, const uint8_t* wb, const Unpacked* u, const typename S::SubScale* ss,
                       int sb, int64_t r0, I* isum) {
    if constexpr (R <= 2) quarter<R, Stored, Fmt, Q>(a, wb, u, ss, sb, r0, isum);
    else quarter_call<R, Stored, Fmt, Q>(a, wb, u, ss, sb, r0, isum);
    if constexpr (Q < 3) quarters<R, Stored, Fmt, Q + 1>(a, wb, u, ss, sb, r0, isum);
  }

  // A super-block of a 16-input-sub-block format: its scales and operands unpacked (Stored), or R of its rows
  // folded into y: the four quarters' sums, then through the activations' sums (|xsum_s| <= 2032) either the mins,
  // imin = sum_s mn_s xsum_s folded with dmin (Q2_K, as Q4_K), or the quants' offset (Q6_K's 32, Q3_K's 4:
  // 2^kShift), isum -= offset sum_s sc_s xsum_s; the scales or mins paired as Fmt::scales pairs them, the sums as
  // Fmt::kXPair (kernels.h) says.
  template <class Fmt>
  static void unpack16(const uint8_t* wb, Unpacked& u) {
    Fmt::scales(wb, u.sc, u.mn);
    unpack_quarters<Fmt>(wb, u);
  }
  template <int R, bool Stored, class Fmt>
  static void rows16(const LinearArgs& a, const uint8_t* wb, const Unpacked* u, int sb, int64_t r0, F* y) {
    const int ns = (a.in + kSuper - 1) / kSuper;
    typename S::SubScale ssd[16];
    I opd[8];
    if constexpr (!Stored) Fmt::scales(wb, ssd, opd);
    const typename S::SubScale* ss = Stored ? u->sc : ssd;
    const I* op = Stored ? u->mn : opd;
    I isum[R];
    for (int r = 0; r < R; ++r) isum[r] = S::i32_zero();
    quarters<R, Stored, Fmt>(a, wb, u, ss, sb, r0, isum);
    const F d = S::load_f16(reinterpret_cast<const uint16_t*>(wb + Fmt::kD));
    F dmin = S::zero();
    if constexpr (Fmt::kMins) dmin = S::load_f16(reinterpret_cast<const uint16_t*>(wb + Fmt::kDMin));
    for (int r = 0; r < R; ++r) {
      const I off = B::template pair_dot<8>(op, a.xpair + ((r0 + r) * ns + sb) * kXPairs + Fmt::kXPair);
      const F dx = S::set1(a.dx[(r0 + r) * ns + sb]);
      if constexpr (Fmt::kMins) {  // off: the mins' sum
        y[r] = fold_mins(y[r], isum[r], off, d, dmin, dx);
      } else {
        isum[r] = S::i32_sub(isum[r], S::i32_shl(off, Fmt::kShift));
        y[r] = S::fma(S::to_float(isum[r]), S::mul(d, dx), y[r]);
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
