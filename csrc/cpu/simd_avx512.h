// 16 fp32 lanes as one 512-bit register: the vector vocabulary gemm.h, rowwise.h and attention.h are
// written in. Include only from kernels_avx512.cpp, after its `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

namespace decodescope::cpu {
namespace {  // internal linkage: each ISA's translation unit keeps its own copies

struct Avx512 {
  using F = __m512;   // 16 x fp32
  using I = __m512i;  // 16 x int32
  static constexpr const char* kName = "avx512 (vnni)";
  static constexpr int kRegs = 32;  // vector registers; the row tiles are sized from it
  static constexpr int kLanesPerReg = 16;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }  // lanes >= n are 0
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, F v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static unsigned ge_bits(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }  // bit i: lane i of a >= b
  static F keep_ge(F a, F b, F v) {  // v where a >= b, else 0
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_GE_OQ), v);
  }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }      // a * b + c
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }    // c - a * b
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F abs(F a) { return _mm512_abs_ps(a); }
  static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }  // half-even
  // 16 lanes holding small integers -> 16 int8.
  static void store_i8(int8_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  static float reduce_add(F v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(F v) { return _mm512_reduce_max_ps(v); }

  // 16 fp16 values (IEEE bits) -> fp32, exact.
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 16 bf16 values -> fp32, exact: a bf16 is the top half of its fp32.
  static F load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }

  // int8 (W8A8) dot products: 16 outputs x 4 inputs of offset-binary weights (q + 128) against 4 int8 activations
  // broadcast to every output. VNNI's vpdpbusd multiplies unsigned by signed bytes and adds the four
  // products into int32 without saturation; the +128 offset is taken out by starting each block's
  // accumulator at -128 * sum(qx) (kQ8Offset).
  static constexpr bool kQ8Offset = true;
  struct Q8W {
    I w;
  };
  static Q8W q8_load(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
  static I q8_init(int32_t offset) { return _mm512_set1_epi32(offset); }
  static I q8_dot(I acc, const Q8W& w, int32_t x4) { return _mm512_dpbusd_epi32(acc, w.w, _mm512_set1_epi32(x4)); }

  // e^x = p * 2^n for x in [kExpLo, kExpHi]: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a
  // degree-6 polynomial: about 1 ulp.
  static constexpr float kExpLo = -87.33654f, kExpHi = 88.72283f;
  static F exp_reduced(F x, F& n) {
    n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    F r = fnma(n, set1(0.693359375f), x);
    r = fnma(n, set1(-2.12194440e-4f), r);
    F p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    return fma(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set1(1.0f)));
  }

  // e^x as torch computes it at the edges: NaN stays NaN, +inf and lanes above ln(FLT_MAX) give +inf, lanes
  // below -87.3 give 0 (so exp(-inf) = 0; torch's denormal results there are below the ops' tolerance).
  static F exp(F x) {
    const F lo = set1(kExpLo), hi = set1(kExpHi);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 overflow = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    F n;
    const F p = exp_reduced(_mm512_min_ps(_mm512_max_ps(x, lo), hi), n);  // NaN lanes become lo, restored below
    F y = _mm512_scalef_ps(p, n);  // p * 2^n without building the exponent bits by hand
    y = _mm512_mask_blend_ps(underflow, y, zero());
    y = _mm512_mask_blend_ps(overflow, y, set1(INFINITY));
    return _mm512_mask_blend_ps(nan, y, x);
  }

  // e^x for finite x <= 0 (exp_span's c (v - max)): exp's bits without the overflow and NaN lanes it cannot have,
  // the underflow lanes zeroed by the scalef's mask.
  static F exp_le0(F x) {
    const __mmask16 normal = _mm512_cmp_ps_mask(x, set1(kExpLo), _CMP_GE_OQ);
    F n;
    const F p = exp_reduced(_mm512_max_ps(x, set1(kExpLo)), n);
    return _mm512_maskz_scalef_ps(normal, p, n);
  }

  // 0 when every lane of a and b is finite, NaN when one holds inf or NaN (0 * inf = NaN; the sum of zeros is 0).
  static float nonfinite(F a, F b) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_mul_ps(a, zero()), _mm512_mul_ps(b, zero())));
  }

  // ---- 16-bit activations (gemm.h, q16.h): exact integer sums over the int8 halves hi, lo of x16 --------
  // The prep's plane writer: a block's 32 rounded values (exact integers in floats) -> the hi and lo planes at
  // offset o; the block's sum of x16 and of hi.
  static void store_x16(F q0, F q1, const Act16& a, int64_t o, int32_t& sum, int32_t& shi) {
    const I i0 = _mm512_cvtps_epi32(q0), i1 = _mm512_cvtps_epi32(q1);
    const I h0 = _mm512_srai_epi32(i0, 8), h1 = _mm512_srai_epi32(i1, 8);
    const I l0 = _mm512_and_si512(i0, _mm512_set1_epi32(255)), l1 = _mm512_and_si512(i1, _mm512_set1_epi32(255));
    sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    shi = _mm512_reduce_add_epi32(_mm512_add_epi32(h0, h1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.hi + o), _mm512_cvtepi32_epi8(h0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.hi + o + 16), _mm512_cvtepi32_epi8(h1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.lo + o), _mm512_cvtepi32_epi8(l0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a.lo + o + 16), _mm512_cvtepi32_epi8(l1));
  }

  // A row's sums over one block, 16 outputs: sum q * hi and sum q * lo, so S = 256 hi + lo (q16_sum). VPDPBUSD
  // multiplies unsigned by signed bytes: hi (signed) goes against the weights as unsigned, lo (unsigned) against
  // them as signed; both are legal because q4's nibbles are 0..15, and for q8 the offset-binary bytes q + 128 are
  // the unsigned form, q itself (xor 0x80) the signed one, the offset taken out by starting hi at -128 * sum(hi).
  struct Q16Acc {
    I hi, lo;
  };
  static Q16Acc q16_init(int32_t q8_shi) { return {_mm512_set1_epi32(-128 * q8_shi), _mm512_setzero_si512()}; }
  static I q16_sum(const Q16Acc& acc) { return _mm512_add_epi32(_mm512_slli_epi32(acc.hi, 8), acc.lo); }
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }

  // A 64-byte chunk of a q4 block: inputs 8c..8c+3 (low nibbles) and 8c+4..8c+7 (high), 16 outputs x 4 bytes each.
  struct Q4Chunk {
    I w0, w1;
  };
  static Q4Chunk q4_chunk(const uint8_t* p) {
    const I v = _mm512_loadu_si512(p), nib = _mm512_set1_epi8(0x0F);
    return {_mm512_and_si512(v, nib), _mm512_and_si512(_mm512_srli_epi16(v, 4), nib)};
  }
  // acc += the chunk's 8 inputs of one row, starting at plane offset o.
  static void q4_dot16(Q16Acc& acc, const Q4Chunk& w, const Act16& x, int64_t o) {
    acc.hi = _mm512_dpbusd_epi32(acc.hi, w.w0, _mm512_set1_epi32(load4(x.hi + o)));
    acc.lo = _mm512_dpbusd_epi32(acc.lo, _mm512_set1_epi32(load4(x.lo + o)), w.w0);
    acc.hi = _mm512_dpbusd_epi32(acc.hi, w.w1, _mm512_set1_epi32(load4(x.hi + o + 4)));
    acc.lo = _mm512_dpbusd_epi32(acc.lo, _mm512_set1_epi32(load4(x.lo + o + 4)), w.w1);
  }

  // 64 bytes of a q8 block: 16 outputs x 4 inputs, q + 128 and q.
  struct Q8Group {
    I u, s;
  };
  static Q8Group q8_group(const uint8_t* p) {
    const I v = _mm512_loadu_si512(p);
    return {v, _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)))};
  }
  // acc += the group's 4 inputs of one row, starting at plane offset o.
  static void q8_dot16(Q16Acc& acc, const Q8Group& w, const Act16& x, int64_t o) {
    acc.hi = _mm512_dpbusd_epi32(acc.hi, w.u, _mm512_set1_epi32(load4(x.hi + o)));
    acc.lo = _mm512_dpbusd_epi32(acc.lo, _mm512_set1_epi32(load4(x.lo + o)), w.s);
  }

  // ---- K-quants (kquants.h): 64 bytes of 16 outputs x 4 unsigned weights against 4 int8 activations -------
  using U8 = __m512i;
  static U8 u8_load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static U8 u8_and(U8 a, int m) { return _mm512_and_si512(a, _mm512_set1_epi8(static_cast<char>(m))); }
  static U8 u8_or(U8 a, U8 b) { return _mm512_or_si512(a, b); }
  // shifts in 16-bit lanes: bits cross into the neighbouring byte, so a mask follows every use
  static U8 u8_shl(U8 a, int n) { return _mm512_sll_epi16(a, _mm_cvtsi32_si128(n)); }
  static U8 u8_shr(U8 a, int n) { return _mm512_srl_epi16(a, _mm_cvtsi32_si128(n)); }
  // acc + each output's 4 weights times x4's 4 signed bytes: VPDPBUSD, exact in int32
  static I dot_u8s8(I acc, U8 w, int32_t x4) { return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4)); }
  // a sub-block's sums (kquants.h): VPDPBUSD's int32 hold any number of groups, the scale a multiply
  using Sub = I;
  using SubScale = I;
  static constexpr int kSubSum = 2147483647;
  static Sub sub_zero() { return _mm512_setzero_si512(); }
  static Sub sub_dot(Sub acc, U8 w, int32_t x4) { return dot_u8s8(acc, w, x4); }
  static SubScale sub_scale(I sc) { return sc; }
  static I sub_scaled(Sub acc, SubScale sc) { return _mm512_mullo_epi32(acc, sc); }
  // Sums that fit in int16 (Q3_K's sub-block: 16 inputs x 7 x 127) scaled by VPMADDWD, the scale in each lane's low
  // half and zero above (sub_scale16): one instruction where VPMULLD is two (Intel's), the same integer
  static SubScale sub_scale16(SubScale sc) { return _mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)); }
  static I sub_scaled16(Sub acc, SubScale sc) { return _mm512_madd_epi16(acc, sc); }
  // K-quant scales and mins (kquants.h scales_q4k, kquants16.h scales_q6k; v: two sub-blocks' bytes of 16 rows, row j at
  // byte j of each half, unsigned or signed): the scales as int32 lanes, the mins as int16 pairs for min_dot
  // (VPDPWSSD, exact in int32).
  template <bool Signed = false>
  static void sub_scales(__m256i v, SubScale& a, SubScale& b) {
    const __m128i s = _mm256_castsi256_si128(v), t = _mm256_extracti128_si256(v, 1);
    if constexpr (Signed) a = _mm512_cvtepi8_epi32(s), b = _mm512_cvtepi8_epi32(t);
    else a = _mm512_cvtepu8_epi32(s), b = _mm512_cvtepu8_epi32(t);
  }
  template <bool Signed = false>
  static I min_pairs(__m256i v) {
    const __m128i s = _mm256_castsi256_si128(v), t = _mm256_extracti128_si256(v, 1);
    const __m256i pairs =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(s, t)), _mm_unpackhi_epi8(s, t), 1);
    if constexpr (Signed) return _mm512_cvtepi8_epi16(pairs);
    else return _mm512_cvtepu8_epi16(pairs);
  }
  static I min_dot(I acc, I pairs, int32_t x2) { return _mm512_dpwssd_epi32(acc, pairs, _mm512_set1_epi32(x2)); }
  static I i32_zero() { return _mm512_setzero_si512(); }
  static I i32_set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I i32_add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I i32_sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I i32_shl(I a, int n) { return _mm512_sll_epi32(a, _mm_cvtsi32_si128(n)); }
  static I i32_load(const uint8_t* p) { return _mm512_loadu_si512(p); }  // 64 bytes: 16 int32
  // Q5_0's fifth bits (legacy.h): bits k..k+3 of each lane's mask -> bit 4 of its bytes 0..3. t * 0x00204081
  // puts bit r of t at bit 8r (the shifted copies of t occupy disjoint bits, so nothing carries).
  static U8 fifth_bits(I mask, int k) {
    const I t = _mm512_and_si512(_mm512_srl_epi32(mask, _mm_cvtsi32_si128(k)), _mm512_set1_epi32(15));
    const I spread = _mm512_and_si512(_mm512_mullo_epi32(t, _mm512_set1_epi32(0x00204081)), _mm512_set1_epi32(0x01010101));
    return _mm512_slli_epi32(spread, 4);
  }

  // v[0..15] -> one vector whose lane i is the sum of v[i]'s lanes: a transpose-and-add tree, 15 adds.
  static F hsum16(const F* v) {
    F a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i)  // 512 -> 256: lanes 0-7 hold v[2i]'s halves summed, 8-15 v[2i+1]'s
      a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)  // 256 -> 128 within each half
      b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)  // 128 -> 64 within each 128-bit lane
      c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const F s = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
    // The tree leaves v[i]'s sum in lane 4 * (i % 4) + i / 4; gather them back in order.
    const I order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, s);
  }

  // v[0..15] -> lane i = the largest of v[i]'s lanes: hsum16's tree with max (exact in any order; no NaN lanes).
  static F hmax16(const F* v) {
    F a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i)
      a[i] = _mm512_max_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)
      b[i] = _mm512_max_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i)
      c[i] = _mm512_max_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const F s = _mm512_max_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
    const I order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, s);
  }

 private:
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static int32_t load4(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

}  // namespace
}  // namespace decodescope::cpu
