// 16 fp32 lanes as a pair of 256-bit registers: the AVX2 + FMA + F16C floor, with the vocabulary of
// simd_avx512.h. Include only from kernels_avx2.cpp, after its `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace decodescope::cpu {
namespace {  // internal linkage: each ISA's translation unit keeps its own copies

struct Avx2 {
  struct F {
    __m256 lo, hi;  // lanes 0-7, 8-15
  };
  struct I {
    __m256i lo, hi;
  };
  static constexpr const char* kName = "avx2";
  static constexpr int kRegs = 16;
  static constexpr int kLanesPerReg = 8;

  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F load_n(const float* p, int n) {  // lanes >= n are 0
    return {_mm256_maskload_ps(p, mask(n)), _mm256_maskload_ps(p + 8, mask(n - 8))};
  }
  static void store(float* p, F v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
  static void store_n(float* p, F v, int n) {
    _mm256_maskstore_ps(p, mask(n), v.lo);
    _mm256_maskstore_ps(p + 8, mask(n - 8), v.hi);
  }
  static F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static F sub(F a, F b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F max(F a, F b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static unsigned ge_bits(F a, F b) {  // bit i: lane i of a >= b
    return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ))) |
           static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ))) << 8;
  }
  static F keep_ge(F a, F b, F v) {  // v where a >= b, else 0
    return {_mm256_and_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_GE_OQ), v.lo),
            _mm256_and_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_GE_OQ), v.hi)};
  }
  static F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static F fnma(F a, F b, F c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
  static F div(F a, F b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
  static F abs(F a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
  }
  static F round(F a) {  // half-even
    constexpr int kMode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(a.lo, kMode), _mm256_round_ps(a.hi, kMode)};
  }
  static void store_i8(int8_t* p, F v) {  // 16 lanes holding small integers -> 16 int8, in order
    const __m256i lo = _mm256_cvtps_epi32(v.lo), hi = _mm256_cvtps_epi32(v.hi);
    const __m128i a = _mm_packs_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    const __m128i b = _mm_packs_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(a, b));
  }
  static float reduce_add(F v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
  static float reduce_max(F v) {
    __m256 m = _mm256_max_ps(v.lo, v.hi);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
  }

  static F load_f16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
  }
  // bf16 -> fp32, exact: a bf16 is the top half of its fp32.
  static F load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    return {_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)};
  }

  // int8 (W8A8) without VNNI: maddubs multiplies unsigned by signed bytes into saturating int16 pairs, and 2 * 255 *
  // 127 would saturate. So the weights go back to signed q (xor 0x80) and the sign moves to the activation:
  // |q| * (qx * sign(q)) <= 2 * 127 * 127 per pair, no saturation, and no offset to take out.
  static constexpr bool kQ8Offset = false;
  struct Q8W {
    __m256i abs_lo, abs_hi, sgn_lo, sgn_hi;  // |q| and q itself, outputs 0-7 and 8-15
  };
  static Q8W q8_load(const uint8_t* p) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), flip);
    const __m256i hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), flip);
    return {_mm256_abs_epi8(lo), _mm256_abs_epi8(hi), lo, hi};
  }
  static I q8_init(int32_t) { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static I q8_dot(I acc, const Q8W& w, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4), ones = _mm256_set1_epi16(1);
    const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_lo, _mm256_sign_epi8(x, w.sgn_lo)), ones);
    const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs_hi, _mm256_sign_epi8(x, w.sgn_hi)), ones);
    return {_mm256_add_epi32(acc.lo, lo), _mm256_add_epi32(acc.hi, hi)};
  }
  static F to_float(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }

  // e^x as in simd_avx512.h, NaN and inf included.
  static F exp(F x) { return {exp8(x.lo), exp8(x.hi)}; }

  // e^x for finite x <= 0 (logsumexp's x - max): clamped below at -87.3 (e^x then ~1e-38 against a sum >= 1),
  // n = round(x log2 e) by the 1.5 * 2^23 addition and 2^n from its low bits, exp8's polynomial; no inf, NaN or
  // overflow lanes to mend. 1.7x exp8's speed on a 2-core AVX2 EPYC (49,152 values: 49 against 85 us), ~1e-7.
  static F exp_le0(F x) { return {exp8_le0(x.lo), exp8_le0(x.hi)}; }

  // 0 when every lane of a and b is finite, NaN when one holds inf or NaN.
  static float nonfinite(F a, F b) {
    const __m256 z = _mm256_setzero_ps();
    return hsum8(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(a.lo, z), _mm256_mul_ps(a.hi, z)),
                               _mm256_add_ps(_mm256_mul_ps(b.lo, z), _mm256_mul_ps(b.hi, z))));
  }

  // ---- 16-bit activations (gemm.h, q16.h) without VNNI ---------------------------------------------------
  // The plane writer: hi and lo as AVX-512's (q4: VPMADDUBSW), and x16 itself with each group of 4 in kPairOrder
  // (q8: VPMADDWD against the sign-extended weight pairs of q8_group).
  static void store_x16(F q0, F q1, const Act16& a, int64_t o, int32_t& sum, int32_t& shi) {
    const __m256i i[4] = {_mm256_cvtps_epi32(q0.lo), _mm256_cvtps_epi32(q0.hi), _mm256_cvtps_epi32(q1.lo),
                          _mm256_cvtps_epi32(q1.hi)};
    __m256i h[4], l[4];
    for (int k = 0; k < 4; ++k) {
      h[k] = _mm256_srai_epi32(i[k], 8);
      l[k] = _mm256_and_si256(i[k], _mm256_set1_epi32(255));
    }
    sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
    shi = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(h[0], h[1]), _mm256_add_epi32(h[2], h[3])));
    const __m256i order = _mm256_setr_epi8(0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15, 0, 1, 4, 5, 2, 3, 6,
                                           7, 8, 9, 12, 13, 10, 11, 14, 15);
    for (int k = 0; k < 2; ++k) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.hi + o + 16 * k), bytes16(h[2 * k], h[2 * k + 1], false));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.lo + o + 16 * k), bytes16(l[2 * k], l[2 * k + 1], true));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.xp + o + 16 * k),
                          _mm256_shuffle_epi8(int16s(i[2 * k], i[2 * k + 1]), order));
    }
  }

  // A row's sums over one block, outputs 0-7 and 8-15 in each pair: sum q * hi in int16 lanes (two a output),
  // sum q * lo (q4) or sum q * x16 (q8) in int32. S = 256 hi + lo.
  struct Q16Acc {
    __m256i hi[2], lo[2];
  };
  static Q16Acc q16_init(int32_t) {
    const __m256i z = _mm256_setzero_si256();
    return {{z, z}, {z, z}};
  }
  static I q16_sum(const Q16Acc& acc) {
    const __m256i k256 = _mm256_set1_epi16(256);
    return {_mm256_add_epi32(_mm256_madd_epi16(acc.hi[0], k256), acc.lo[0]),
            _mm256_add_epi32(_mm256_madd_epi16(acc.hi[1], k256), acc.lo[1])};
  }

  // q4: VPMADDUBSW, AVX-512's VPDPBUSD in 16-bit lanes with saturation: hi (signed) against the nibbles as
  // unsigned, a pair at most 2 * 15 * 128 = 3840, so a block's 8 pairs a lane stay below 2^15 in int16; lo
  // (unsigned) against the nibbles as signed, a pair at most 2 * 255 * 15 = 7650, widened each chunk (VPMADDWD
  // by ones). A chunk: inputs 8c..8c+3 (low nibbles) and 8c+4..8c+7 (high), outputs 0-7 and 8-15.
  struct Q4Chunk {
    __m256i w0[2], w1[2];
  };
  static Q4Chunk q4_chunk(const uint8_t* p) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    Q4Chunk w;
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
      w.w0[h] = _mm256_and_si256(v, nib);
      w.w1[h] = _mm256_srli_epi16(_mm256_andnot_si256(nib, v), 4);  // masked first: KQuants::nibbles
    }
    return w;
  }
  static void q4_dot16(Q16Acc& acc, const Q4Chunk& w, const Act16& x, int64_t o) {
    const __m256i ha = _mm256_set1_epi32(load4(x.hi + o)), hb = _mm256_set1_epi32(load4(x.hi + o + 4));
    const __m256i la = _mm256_set1_epi32(load4(x.lo + o)), lb = _mm256_set1_epi32(load4(x.lo + o + 4));
    for (int h = 0; h < 2; ++h) {
      const __m256i hi = _mm256_add_epi16(_mm256_maddubs_epi16(w.w0[h], ha), _mm256_maddubs_epi16(w.w1[h], hb));
      const __m256i lo = _mm256_add_epi16(_mm256_maddubs_epi16(la, w.w0[h]), _mm256_maddubs_epi16(lb, w.w1[h]));
      acc.hi[h] = _mm256_add_epi16(acc.hi[h], hi);
      acc.lo[h] = _mm256_add_epi32(acc.lo[h], _mm256_madd_epi16(lo, _mm256_set1_epi16(1)));
    }
  }

  // q8: a group (16 outputs x 4 inputs, q + 128) as int16 pairs of q, inputs (0, 2) and (1, 3), against x16 in
  // the same pairs (kPairOrder); products <= 127 * 32767, pair sums < 2^23, exact in int32.
  struct Q8Group {
    __m256i a[2], b[2];
  };
  static Q8Group q8_group(const uint8_t* p) {
    Q8Group w;
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)),
                                         _mm256_set1_epi8(static_cast<char>(0x80)));
      w.a[h] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
      w.b[h] = _mm256_srai_epi16(v, 8);
    }
    return w;
  }
  static void q8_dot16(Q16Acc& acc, const Q8Group& w, const Act16& x, int64_t o) {
    const __m256i xa = _mm256_set1_epi32(load4(x.xp + o)), xb = _mm256_set1_epi32(load4(x.xp + o + 2));
    for (int h = 0; h < 2; ++h)
      acc.lo[h] = _mm256_add_epi32(acc.lo[h], _mm256_add_epi32(_mm256_madd_epi16(w.a[h], xa),
                                                               _mm256_madd_epi16(w.b[h], xb)));
  }

  // ---- K-quants (kquants.h) without VNNI: VPMADDUBSW's saturating int16 pairs cannot saturate here, a
  // pair at most 2 * 63 * 128 = 16128 (6-bit weights), then VPMADDWD by ones into int32: exact, as VPDPBUSD.
  struct U8 {
    __m256i lo, hi;  // outputs 0-7, 8-15
  };
  static U8 u8_load(const uint8_t* p) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
  }
  static U8 u8_and(U8 a, int m) {
    const __m256i v = _mm256_set1_epi8(static_cast<char>(m));
    return {_mm256_and_si256(a.lo, v), _mm256_and_si256(a.hi, v)};
  }
  static U8 u8_or(U8 a, U8 b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
  static U8 u8_shl(U8 a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_sll_epi16(a.lo, c), _mm256_sll_epi16(a.hi, c)};
  }
  static U8 u8_shr(U8 a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_srl_epi16(a.lo, c), _mm256_srl_epi16(a.hi, c)};
  }
  // The sum pinned in its register as sub_dot's (below): Q4_0 from L2, one thread, 8.7-8.9 -> 7.9-8.1 us at T = 1
  // and 41.6-42.1 -> 36.7-37.0 at T = 6 (256 x 1536); Q5_0, whose fifth bits cost as much as the rest, unchanged.
  static I dot_u8s8(I acc, U8 w, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4), ones = _mm256_set1_epi16(1);
    I r{_mm256_add_epi32(acc.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(w.lo, x), ones)),
        _mm256_add_epi32(acc.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(w.hi, x), ones))};
    asm("" : "+x"(r.lo), "+x"(r.hi));
    return r;
  }
  // A sub-block's sums kept in 16 bits (Q4_K, Q5_K): VPMADDUBSW's pairs added as they come, widened once by
  // VPMADDWD with the sub-block's scale, which also applies it: 5 instructions a group and row instead of 7
  // and a multiply. Exact while a lane's sum stays in int16: a Sub holds at most kSubSum / (2 * wmax * 128)
  // groups (kquants.h).
  struct Sub {
    __m256i lo, hi;
  };
  using SubScale = I;  // the scale in both 16-bit halves of each lane
  static constexpr int kSubSum = 32767;
  static Sub sub_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  // The empty asm pins each sum in a register in the order written: without it GCC reassociates a Sub's chain
  // of adds into a tree, hoists all of a pass's products ahead of it and spills them (a Q4_K super-block at
  // T = 1 went from 67 stack moves to none: 29 GB/s from L2 on one thread where it ran at 24-26, and 16-row
  // verify passes of Q4_K 23-27%, Q5_K 17-22% and Q6_K 0-9% quicker).
  static Sub sub_dot(Sub acc, U8 w, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    Sub r{_mm256_add_epi16(acc.lo, _mm256_maddubs_epi16(w.lo, x)),
          _mm256_add_epi16(acc.hi, _mm256_maddubs_epi16(w.hi, x))};
    asm("" : "+x"(r.lo), "+x"(r.hi));
    return r;
  }
  static SubScale sub_scale(I sc) {  // sc in 0..32767
    return {_mm256_or_si256(sc.lo, _mm256_slli_epi32(sc.lo, 16)), _mm256_or_si256(sc.hi, _mm256_slli_epi32(sc.hi, 16))};
  }
  static I sub_scaled(Sub acc, SubScale sc) {
    return {_mm256_madd_epi16(acc.lo, sc.lo), _mm256_madd_epi16(acc.hi, sc.hi)};
  }
  // (simd_avx512.h's sums known to fit in int16: here every Sub's are, and sub_scaled already takes them so)
  static SubScale sub_scale16(SubScale sc) { return sc; }
  static I sub_scaled16(Sub acc, SubScale sc) { return sub_scaled(acc, sc); }
  // K-quant scales and mins (kquants.h scales_q4k, kquants16.h scales_q6k): v holds two sub-blocks' bytes of 16 rows (bytes
  // 0-15 and 16-31, row j at byte j), unsigned (Q4_K, Q5_K) or signed (Q6_K). Each half broadcast to both 128-bit
  // lanes, one byte shuffle puts row j's byte in both 16-bit halves of lane j (rows 0-7 in lo, 8-15 in hi), as
  // sub_scaled wants it: in the low byte (zero-extended), or in the high byte, then shifted down with its sign.
  template <bool Signed = false>
  static void sub_scales(__m256i v, SubScale& a, SubScale& b) {
    __m256i rows_lo = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5,
                                       -1, 6, -1, 6, -1, 7, -1, 7, -1);  // -1: a zero byte
    if constexpr (Signed) rows_lo = _mm256_or_si256(_mm256_slli_epi16(rows_lo, 8), _mm256_set1_epi16(0xFF));
    const __m256i rows_hi = _mm256_add_epi16(rows_lo, _mm256_set1_epi16(Signed ? 0x0800 : 8));  // rows 8-15
    const __m256i x = _mm256_permute2x128_si256(v, v, 0x00), y = _mm256_permute2x128_si256(v, v, 0x11);
    a = {_mm256_shuffle_epi8(x, rows_lo), _mm256_shuffle_epi8(x, rows_hi)};
    b = {_mm256_shuffle_epi8(y, rows_lo), _mm256_shuffle_epi8(y, rows_hi)};
    if constexpr (Signed) {
      a = {_mm256_srai_epi16(a.lo, 8), _mm256_srai_epi16(a.hi, 8)};
      b = {_mm256_srai_epi16(b.lo, 8), _mm256_srai_epi16(b.hi, 8)};
    }
  }
  // ... the two sub-blocks' bytes of row j as an int16 pair in lane j, for min_dot
  template <bool Signed = false>
  static I min_pairs(__m256i v) {
    const __m256i swap = _mm256_permute2x128_si256(v, v, 0x01);
    const __m256i lo = _mm256_unpacklo_epi8(v, swap), hi = _mm256_unpackhi_epi8(v, swap);  // low lanes: rows 0-7, 8-15
    const __m128i l = _mm256_castsi256_si128(lo), h = _mm256_castsi256_si128(hi);
    if constexpr (Signed) return {_mm256_cvtepi8_epi16(l), _mm256_cvtepi8_epi16(h)};
    else return {_mm256_cvtepu8_epi16(l), _mm256_cvtepu8_epi16(h)};
  }
  // acc + each lane's int16 pair times x2's two int16 (VPMADDWD): exact in int32
  static I min_dot(I acc, I pairs, int32_t x2) {
    const __m256i x = _mm256_set1_epi32(x2);
    return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(pairs.lo, x)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(pairs.hi, x))};
  }
  static I i32_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static I i32_set1(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
  static I i32_add(I a, I b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
  static I i32_sub(I a, I b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
  static I i32_shl(I a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return {_mm256_sll_epi32(a.lo, c), _mm256_sll_epi32(a.hi, c)};
  }
  static I i32_load(const uint8_t* p) {  // 64 bytes: 16 int32
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
  }
  // Q5_0's fifth bits (legacy.h): bits k..k+3 of each lane's mask -> bit 4 of its bytes 0..3. The mask's byte k / 8
  // copied into the lane's four bytes (VPSHUFB), then byte b tests bit k % 8 + b. No multiply: with the VPMULLD
  // spread (the one simd_avx512.h keeps) a Zen 1 core (128-bit halves) ran Q5_0 from L2 at 0.6x Q4_0's speed, and
  // this is 1.46x that (one thread, 1024 x 1536, 3 alternating rounds: 205-212 -> 141-144 us; 6 rows 865 -> 713 us).
  static U8 fifth_bits(I mask, int k) {
    const __m256i lanes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
    const __m256i idx = _mm256_add_epi8(lanes, _mm256_set1_epi8(static_cast<char>(k / 8)));
    const __m256i bits = _mm256_set1_epi32(static_cast<int>(0x08040201u << (k % 8))), bit4 = _mm256_set1_epi8(16);
    const auto one = [&](__m256i m) {
      return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(m, idx), bits), bits), bit4);
    };
    return {one(mask.lo), one(mask.hi)};
  }

  // v[0..15] -> lane i = sum of v[i]'s lanes.
  static F hsum16(const F* v) {
    __m256 s[16];
    for (int i = 0; i < 16; ++i) s[i] = _mm256_add_ps(v[i].lo, v[i].hi);
    return {hsum8x8(s), hsum8x8(s + 8)};
  }

  // v[0..15] -> lane i = the largest of v[i]'s lanes (exact in any order; no NaN lanes).
  static F hmax16(const F* v) {
    __m256 s[16];
    for (int i = 0; i < 16; ++i) s[i] = _mm256_max_ps(v[i].lo, v[i].hi);
    return {hmax8x8(s), hmax8x8(s + 8)};
  }

 private:
  static __m256 hmax8x8(const __m256* s) {  // lane i = max of s[i]: interleave pairs, then quads, then halves
    __m256 t[4], u[2];
    for (int k = 0; k < 4; ++k)
      t[k] = _mm256_max_ps(_mm256_unpacklo_ps(s[2 * k], s[2 * k + 1]), _mm256_unpackhi_ps(s[2 * k], s[2 * k + 1]));
    for (int j = 0; j < 2; ++j)
      u[j] = _mm256_max_ps(_mm256_shuffle_ps(t[2 * j], t[2 * j + 1], 0x44),
                           _mm256_shuffle_ps(t[2 * j], t[2 * j + 1], 0xEE));
    return _mm256_max_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
  }
  static __m256i mask(int n) {  // lanes < n set; n may be < 0 or > 8
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static int32_t load4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  // 16 int32 (a: lanes 0-7, b: 8-15) -> 16 int16 in order: packs works per 128-bit lane, the permute restores it.
  static __m256i int16s(__m256i a, __m256i b) { return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8); }
  // ... -> 16 bytes in order, values in [-128, 127] (or [0, 255] when unsigned)
  static __m128i bytes16(__m256i a, __m256i b, bool unsigned_bytes) {
    const __m256i w = int16s(a, b);
    const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    return unsigned_bytes ? _mm_packus_epi16(lo, hi) : _mm_packs_epi16(lo, hi);
  }
  static int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
  }
  static float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
  }
  static __m256 hsum8x8(const __m256* s) {  // lane i = sum of s[i]
    const __m256 a0 = _mm256_hadd_ps(s[0], s[1]), a1 = _mm256_hadd_ps(s[2], s[3]);
    const __m256 a2 = _mm256_hadd_ps(s[4], s[5]), a3 = _mm256_hadd_ps(s[6], s[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);  // [0 1 2 3 | 0 1 2 3] halves, [4..7]
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
  }
  static __m256 pow2(__m256i k) {  // 2^k for k in [-126, 127], from its exponent bits
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
  }
  // e^(x - n ln 2) for n = round(x / ln 2): r = x - n ln 2 (ln 2 in two parts, |r| <= ln 2 / 2) into cephes'
  // expf polynomial; exp8 and exp8_le0 scale it by 2^n
  static __m256 exp_reduced(__m256 x, __m256 n) {
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    return _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  }
  static __m256 exp8_le0(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.f);  // 1.5 * 2^23: t's low bits hold n + 2^22
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33654f));
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    const __m256 p = exp_reduced(x, n);
    const __m256i e = _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127 - (1 << 22)));  // n + 127
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));  // n in [-126, 0]: 2^n normal
  }
  static __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    const __m256 overflow = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);  // NaN lanes become lo here, restored below
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 p = exp_reduced(xc, n);
    // p * 2^n as p * 2^n1 * 2^n2 with n1 + n2 = n: the clamp keeps n in [-126, 128], and 2^128 has no exponent
    // bits, its halves do (one rounding, as AVX-512's scalef: the first product is exact)
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1);
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(_mm256_sub_epi32(ni, n1)));
    y = _mm256_andnot_ps(underflow, y);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), overflow);
    return _mm256_blendv_ps(y, x, nan);
  }
};

}  // namespace
}  // namespace decodescope::cpu
