// The K-quant GEMMs (GGUF Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) over panels that are the file's blocks of 16 rows interleaved
// field by field (kernels.h; Q6_K's quant bits regrouped, q6k_group), against llama.cpp's Q8_K activations.
// Written once over a SIMD vocabulary S and compiled in each ISA's translation unit (gemm.h dispatches to them).
// Torch-free.
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
#include "prefetch.h"
#include "q16.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct KQuants {
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

  // sum_s mn_s xsum_s over a super-block's 8 sub-blocks of 32 (xsum_s = xs[2s] + xs[2s + 1], |xsum_s| <= 4064,
  // so a pair of them fits one int32 as two int16).
  static I mins_q4k(const I* mn, const int32_t* xs) {
    I imin = S::i32_zero();
    for (int t = 0; t < 4; ++t) {
      const uint32_t a = static_cast<uint16_t>(xs[4 * t] + xs[4 * t + 1]);
      const uint32_t b = static_cast<uint16_t>(xs[4 * t + 2] + xs[4 * t + 3]);
      imin = S::min_dot(imin, mn[t], static_cast<int32_t>(a | (b << 16)));
    }
    return imin;
  }

  // A byte's low and high nibbles as two vectors of bytes 0..15. The high ones masked before the (16-bit) shift, so
  // no bit crosses into the byte below, and both ANDs read q itself: on a core with 128-bit SIMD halves (a Zen 1
  // EPYC) a Q4_K tile from L2 ran 3-4% quicker than with the shift first (one thread, 1024 x 1536).
  static void nibbles(U8 q, U8& lo, U8& hi) {
    lo = S::u8_and(q, 15);
    hi = S::u8_shr(S::u8_and(q, 0xF0), 4);
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
            stream_line<High ? kQ5KBytes : kQ4KBytes>(wb + q45k_quants(High) + (8 * i + g) * 64);
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
      const I imin = mins_q4k(mn, a.xsum + (row * ns + sb) * (kSuper / 16));
      const F dx = S::set1(a.dx[row * ns + sb]);
      y[r] = S::fma(S::to_float(isum[r]), S::mul(d, dx), y[r]);
      y[r] = S::fnma(S::to_float(imin), S::mul(dmin, dx), y[r]);
    }
  }

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

  // Q6_K, Q3_K and Q2_K, whose sub-blocks are 16 inputs, as quarter() reads them: a quarter q (0..3) of a super-block is
  // 8 groups g of 4 inputs of 16 rows, each giving two operands (Unpacked.w[2 (8q + g)] and the next): the low one
  // of sub-block sub0(q) + (g >= 4) at inputs x0(q) + 4g, the high one of that + kHiSub at x0(q) + kXHi + 4g.
  // Fmt::kMins: the format has mins (Q2_K: scaled by dmin at kDMin), else its quants' offset is 2^kShift.
  struct Q6 {  // q = 2h + ab: half h, k = ab (low) and ab + 2 (high)
    static constexpr int kMax = 63, kHiSub = 4, kXHi = 64, kD = kQ6D, kShift = 5;
    static constexpr bool kMins = false;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* pairs) { scales_q6k(wb + kQ6Scales, ss, pairs); }
    static constexpr int pair(int t, int k) { return 2 * t + k; }  // scales_q6k's pairs: sub-blocks 2t, 2t + 1
    static constexpr int sub0(int q) { return 8 * (q / 2) + 2 * (q % 2); }
    static constexpr int x0(int q) { return 128 * (q / 2) + 32 * (q % 2); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q6k_group(wb, Q / 2, Q % 2, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // X and Z, then Y at ab = 1: each of the 48 lines asked for once
      if constexpr (Q % 2 == 0) {
        stream_line<kQ6KBytes>(wb + q6k_x_at(Q / 2, g));
        stream_line<kQ6KBytes>(wb + q6k_z_at(Q / 2, g));
      } else {
        stream_line<kQ6KBytes>(wb + q6k_y_at(Q / 2, g));
      }
    }
    static I scaled(typename S::Sub acc, typename S::SubScale sc) { return S::sub_scaled(acc, sc); }
  };
  struct Q3 {  // q = 2n + jp / 2: half n, j = jp (low) and jp + 1 (high)
    static constexpr int kMax = 7, kHiSub = 2, kXHi = 32, kD = kQ3D, kShift = 2;
    static constexpr bool kMins = false;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* pairs) { scales_q3k(wb + kQ3Scales, ss, pairs); }
    static constexpr int pair(int t, int k) { return t + 8 * k; }  // scales_q3k's pairs: sub-blocks t, t + 8
    static constexpr int sub0(int q) { return 8 * (q / 2) + 4 * (q % 2); }
    static constexpr int x0(int q) { return 128 * (q / 2) + 64 * (q % 2); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q3k_operands<Q / 2, 2 * (Q % 2)>(wb, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // each of the 24 lines once, at its first use: X, Z, then Y
      if constexpr (Q % 2 == 0) stream_line<kQ3KBytes>(wb + (Q == 0 ? q3k_x_at(g) : q3k_y_at(g)));
      else if constexpr (Q == 1) stream_line<kQ3KBytes>(wb + q3k_z_at(g));
    }
    // a sub-block's sums fit int16 (16 inputs x 7 x 127): VPMADDWD, not VPMULLD
    static I scaled(typename S::Sub acc, typename S::SubScale sc) { return S::sub_scaled16(acc, sc); }
  };
  struct Q2 {  // as Q3: q = 2n + jp / 2, half n, j = jp (low) and jp + 1 (high)
    static constexpr int kMax = 3, kHiSub = 2, kXHi = 32, kD = kQ2D, kDMin = kQ2DMin;
    static constexpr bool kMins = true;
    static void scales(const uint8_t* wb, typename S::SubScale* ss, I* mins) { scales_q2k(wb + kQ2Scales, ss, mins); }
    static constexpr int pair(int t, int k) { return 2 * t + k; }  // scales_q2k's pairs: sub-blocks 2t, 2t + 1
    static constexpr int sub0(int q) { return Q3::sub0(q); }
    static constexpr int x0(int q) { return Q3::x0(q); }
    template <int Q>
    static void operands(const uint8_t* wb, int g, U8& wl, U8& wh) { q2k_operands<Q / 2, 2 * (Q % 2)>(wb, g, wl, wh); }
    template <int Q>
    static void stream(const uint8_t* wb, int g) {  // each of the 16 lines once, at its first use
      if constexpr (Q % 2 == 0) stream_line<kQ2KBytes>(wb + q2k_at(Q / 2, g));
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
  // 2^kShift), isum -= offset sum_s sc_s xsum_s; the scales or mins paired as Fmt::scales pairs them.
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
    for (int r = 0; r < R; ++r) {
      const int32_t* xs = a.xsum + ((r0 + r) * ns + sb) * (kSuper / 16);
      I off = S::i32_zero();
      for (int t = 0; t < 8; ++t) {
        const uint32_t lo16 = static_cast<uint16_t>(xs[Fmt::pair(t, 0)]);
        const uint32_t hi16 = static_cast<uint16_t>(xs[Fmt::pair(t, 1)]);
        off = S::min_dot(off, op[t], static_cast<int32_t>(lo16 | (hi16 << 16)));
      }
      const F dx = S::set1(a.dx[(r0 + r) * ns + sb]);
      if constexpr (Fmt::kMins) {
        const F dmin = S::load_f16(reinterpret_cast<const uint16_t*>(wb + Fmt::kDMin));
        y[r] = S::fma(S::to_float(isum[r]), S::mul(d, dx), y[r]);
        y[r] = S::fnma(S::to_float(off), S::mul(dmin, dx), y[r]);
      } else {
        isum[r] = S::i32_sub(isum[r], S::i32_shl(off, Fmt::kShift));
        y[r] = S::fma(S::to_float(isum[r]), S::mul(d, dx), y[r]);
      }
    }
  }

  // One format's unpack and rows (Bits: 2, 3, 4, 5 or 6).
  template <int Bits>
  static void unpack(const uint8_t* wb, Unpacked& u) {
    if constexpr (Bits == 2) unpack16<Q2>(wb, u);
    else if constexpr (Bits == 3) unpack16<Q3>(wb, u);
    else if constexpr (Bits == 6) unpack16<Q6>(wb, u);
    else q45k_unpack<Bits == 5>(wb, u);
  }
  template <int Bits, int R, bool Stored>
  static void rows(const LinearArgs& a, const uint8_t* wb, const Unpacked* u, int sb, int64_t r0, F* y) {
    if constexpr (Bits == 2) rows16<R, Stored, Q2>(a, wb, u, sb, r0, y);
    else if constexpr (Bits == 3) rows16<R, Stored, Q3>(a, wb, u, sb, r0, y);
    else if constexpr (Bits == 6) rows16<R, Stored, Q6>(a, wb, u, sb, r0, y);
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
      for (int line = 0; line < head_bytes(Bits); line += 64) stream_line<bytes(Bits)>(wb + line);
      if constexpr (Bits == 2) stream_line<bytes(Bits)>(wb + kQ2D);
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
  // x past `in` counts as 0. xsum: the sums of every 16 qx (exact), through one sum tree (S::hsum16) rather than 16
  // horizontal sums, and the inf / NaN test one lane check of v * 0 summed, not a horizontal sum per block.
  static void quantize_rows_k(const float* x, int64_t ldx, int in, int ns, int8_t* qx, float* dx, int32_t* xsum,
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
        for (int k = 0; k < kVecs; ++k) xsum[s * kVecs + k] = static_cast<int32_t>(sums[k]);
        dx[s] = d;
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
