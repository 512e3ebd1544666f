// 16 fp32 lanes as one 512-bit register: the vector vocabulary gemm.h, rowwise.h and attention.h are
// written in. Include only from kernels_avx512.cpp, after its `#pragma GCC target`.
#pragma once

#include <immintrin.h>

#include <cstdint>

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

  // 16 bytes -> the low nibbles and the high nibbles as floats 0..15. vpermps reads only the low 4 bits
  // of each index, so a table lookup does the mask and the conversion in one instruction.
  static void load_nibbles(const uint8_t* p, F& lo, F& hi) {
    const F table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const I bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(bytes, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
  }

  // 64 bytes of an int8 panel group (16 outputs x 4 inputs, offset binary q + 128) -> each input's 16 weights
  // as floats q, exactly: xor 0x80 makes each byte q as a signed byte, and a left shift then an arithmetic
  // right shift sign-extends the byte of input r out of its output's 32-bit lane.
  static void load_q8_inputs(const uint8_t* p, F w[4]) {
    const I q = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0x80808080u)));
    w[0] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(q, 24), 24));
    w[1] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(q, 16), 24));
    w[2] = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(q, 8), 24));
    w[3] = _mm512_cvtepi32_ps(_mm512_srai_epi32(q, 24));
  }

  // q8 dot products: 16 outputs x 4 inputs of offset-binary weights (q + 128) against 4 int8 activations
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
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }

  // e^x, lanes below -87.3 give 0 (so exp(-inf) = 0). Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2,
  // then a degree-6 polynomial: about 1 ulp, well inside the ops' 1e-5 tolerance.
  static F exp(F x) {
    const F lo = set1(-87.33654f);
    const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), set1(88.0f));  // e^88 < FLT_MAX
    const F n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    F r = fnma(n, set1(0.693359375f), x);
    r = fnma(n, set1(-2.12194440e-4f), r);
    F p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set1(1.0f)));
    const F y = _mm512_scalef_ps(p, n);  // p * 2^n without building the exponent bits by hand
    return _mm512_mask_blend_ps(underflow, y, zero());
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

 private:
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
};

}  // namespace
}  // namespace decodescope::cpu
