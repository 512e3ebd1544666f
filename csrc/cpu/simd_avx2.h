// 16 fp32 lanes as a pair of 256-bit registers: the AVX2 + FMA + F16C floor, with the vocabulary of
// simd_avx512.h. Include only from kernels_avx2.cpp, after its `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cstdint>

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

  // 16 bytes -> low and high nibbles as floats 0..15 (vpermps reads the low 3 bits only here, so mask).
  static void load_nibbles(const uint8_t* p, F& lo, F& hi) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i nib = _mm_set1_epi8(0x0F);
    const __m128i l = _mm_and_si128(bytes, nib), h = _mm_and_si128(_mm_srli_epi16(bytes, 4), nib);
    lo = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l, 8)))};
    hi = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h, 8)))};
  }

  // load_q8_inputs as in simd_avx512.h, on the two 32-byte halves (outputs 0-7, 8-15).
  static void load_q8_inputs(const uint8_t* p, F w[4]) {
    const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80808080u));
    const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), flip);
    const __m256i hi = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)), flip);
    w[0] = {to_f(_mm256_srai_epi32(_mm256_slli_epi32(lo, 24), 24)), to_f(_mm256_srai_epi32(_mm256_slli_epi32(hi, 24), 24))};
    w[1] = {to_f(_mm256_srai_epi32(_mm256_slli_epi32(lo, 16), 24)), to_f(_mm256_srai_epi32(_mm256_slli_epi32(hi, 16), 24))};
    w[2] = {to_f(_mm256_srai_epi32(_mm256_slli_epi32(lo, 8), 24)), to_f(_mm256_srai_epi32(_mm256_slli_epi32(hi, 8), 24))};
    w[3] = {to_f(_mm256_srai_epi32(lo, 24)), to_f(_mm256_srai_epi32(hi, 24))};
  }
  static __m256 to_f(__m256i v) { return _mm256_cvtepi32_ps(v); }

  // q8 without VNNI: maddubs multiplies unsigned by signed bytes into saturating int16 pairs, and 2 * 255 *
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

  // e^x as in simd_avx512.h.
  static F exp(F x) { return {exp8(x.lo), exp8(x.hi)}; }

  // v[0..15] -> lane i = sum of v[i]'s lanes.
  static F hsum16(const F* v) {
    __m256 s[16];
    for (int i = 0; i < 16; ++i) s[i] = _mm256_add_ps(v[i].lo, v[i].hi);
    return {hsum8x8(s), hsum8x8(s + 8)};
  }

 private:
  static __m256i mask(int n) {  // lanes < n set; n may be < 0 or > 8
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
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
  static __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.0f));  // e^88 < FLT_MAX
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    // 2^n from its exponent bits: the clamp keeps n in [-126, 127].
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(underflow, y);
  }
};

}  // namespace
}  // namespace decodescope::cpu
