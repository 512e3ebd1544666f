// The sampling noise of one output position (engine/sampling.py Noise): out[i] = -log(u_i), Exp(1) values for the
// exponential race, u_i a uniform of 23 bits, (2k + 1) / 2^24, from a counter-based hash of (key, i), so any slice
// of a row is the same values whichever thread or call made it. The twin, engine/ops/ref.py exp_noise, computes
// the same u_i with torch's integers and -log with torch's; the log here is avx_mathfun's (cephes logf, ~1 ulp).
//
//   x = i * 0x9E3779B9 ^ key_lo,  x = fmix32(x) ^ key_hi,  x = fmix32(x),  k = x >> 9
//
// (fmix32: murmur3's finalizer, a bijection of 32 bits.) race_keyed_span draws against those values without writing
// them. AVX2 only, compiled in kernels_avx2.cpp as exp_noise and race_keyed (kernels.h), which every CPU the module
// runs on has: a row is a few tens of microseconds. Torch-free.
#pragma once

#include <cmath>
#include <cstdint>

#include <immintrin.h>

namespace decodescope::cpu {
namespace {

inline __m256i fmix32_8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// log(x) for x in (0, 1), normal: avx_mathfun's log256_ps (the cephes logf polynomial)
inline __m256 log8_unit(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256i bits = _mm256_castps_si256(x);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  x = _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(~0x7f800000))), _mm256_set1_ps(0.5f));
  const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);  // [0.5, 1/sqrt 2)
  const __m256 tmp = _mm256_and_ps(x, small);
  x = _mm256_sub_ps(x, one);
  e = _mm256_sub_ps(e, _mm256_and_ps(one, small));
  x = _mm256_add_ps(x, tmp);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(7.0376836292E-2f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.1514610310E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.1676998740E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.2420140846E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.4249322787E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.6668057665E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(2.0000714765E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-2.4999993993E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(3.3333331174E-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, x), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
  x = _mm256_add_ps(x, y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), x);
}

// The uniforms u_i of one key, 8 at a time from i0 on (i < 2^31): next() gives those of i, i + 1, ..., i + 7 and
// moves on by 8.
struct Uniforms {
  static constexpr uint32_t kGolden = 0x9E3779B9u;
  __m256i klo, khi, ig;

  Uniforms(uint32_t key_lo, uint32_t key_hi, int64_t i0)
      : klo(_mm256_set1_epi32(static_cast<int>(key_lo))), khi(_mm256_set1_epi32(static_cast<int>(key_hi))),
        ig(_mm256_mullo_epi32(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(i0)), lanes()),
                              _mm256_set1_epi32(static_cast<int>(kGolden)))) {}

  static __m256i lanes() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }

  __m256 next() {
    __m256i x = _mm256_xor_si256(ig, klo);
    x = fmix32_8(_mm256_xor_si256(fmix32_8(x), khi));
    // i * kGolden (mod 2^32) by adding 8 kGolden a step: one VPMULLD fewer per 8 values (slow on some cores)
    ig = _mm256_add_epi32(ig, _mm256_set1_epi32(static_cast<int>(8u * kGolden)));
    const __m256i odd = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(x, 9), 1), _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(odd), _mm256_set1_ps(1.f / 16777216.f));  // exact: odd < 2^24
  }
};

inline __m256 exp_noise8(__m256 u) { return _mm256_sub_ps(_mm256_setzero_ps(), log8_unit(u)); }

// out[i - i0] = -log(u_i) for i in [i0, i1) (i < 2^31)
inline void exp_noise_rows(uint32_t key_lo, uint32_t key_hi, float* out, int64_t i0, int64_t i1) {
  const __m256i lanes = Uniforms::lanes();
  Uniforms uniforms(key_lo, key_hi, i0);
  for (int64_t i = i0; i < i1; i += 8) {
    const __m256 e = exp_noise8(uniforms.next());
    const int64_t left = i1 - i;
    if (left >= 8) {
      _mm256_storeu_ps(out + (i - i0), e);
    } else {  // the last lanes computed as every other's, stored as far as the row goes
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lanes);
      _mm256_maskstore_ps(out + (i - i0), mask, e);
    }
  }
}

// The exponential race of w[i] >= 0 for i in [i0, i1) against the noise of one key, made on the fly: *best = the
// largest w[i] / e_i and *at = the first i holding it, e_i exactly exp_noise_rows's value, so the answer is torch's
// argmax of w / that row (engine/ops/ref.py race). Since -log u >= 1 - u, a value with w_i <= best (1 - u_i) cannot
// beat the best so far (the bound shrunk by 2^-20 for the roundings: the log is within ~2 ulp), and its log is
// skipped; only 8 lanes holding a candidate take one. Over a row a few dozen lanes are candidates (~ln V where each
// new best is a record), so a value costs its hash and a compare. A NaN or inf w sends the span to the plain race,
// where the first NaN wins (torch's argmax).
inline void race_keyed_span(uint32_t key_lo, uint32_t key_hi, const float* w, int64_t i0, int64_t i1, float* best_out,
                            int64_t* at_out) {
  const __m256i lanes = Uniforms::lanes();
  const __m256 shrink = _mm256_set1_ps(1.f - 1.f / 1048576.f), one = _mm256_set1_ps(1.f);
  for (bool prune : {true, false}) {
    Uniforms uniforms(key_lo, key_hi, i0);
    float best = -INFINITY;
    int64_t at = i0;
    __m256 bound = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();  // bound: best, shrunk
    alignas(32) float q[8];
    for (int64_t i = i0; i < i1; i += 8) {
      const int64_t left = i1 - i;
      const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)), lanes);
      const __m256 wv = left >= 8 ? _mm256_loadu_ps(w + i) : _mm256_maskload_ps(w + i, live);
      const __m256 u = uniforms.next();
      bad = _mm256_add_ps(bad, _mm256_mul_ps(wv, _mm256_setzero_ps()));
      int mask = _mm256_movemask_ps(_mm256_castsi256_ps(live));
      if (prune) {  // a candidate: w_i > bound (1 - u_i)
        const __m256 edge = _mm256_mul_ps(bound, _mm256_sub_ps(one, u));
        mask &= _mm256_movemask_ps(_mm256_cmp_ps(wv, edge, _CMP_GT_OQ));
      }
      if (mask == 0) continue;
      _mm256_store_ps(q, _mm256_div_ps(wv, exp_noise8(u)));
      for (int lane = 0; lane < 8; ++lane) {
        if (!(mask >> lane & 1)) continue;
        if (!prune && std::isnan(q[lane])) {  // the plain race: the first NaN wins
          *best_out = q[lane], *at_out = i + lane;
          return;
        }
        if (q[lane] > best) best = q[lane], at = i + lane;
      }
      // w >= 0 (a distribution); were the best negative, nothing would be pruned
      bound = best > 0.f ? _mm256_mul_ps(_mm256_set1_ps(best), shrink)
                         : _mm256_set1_ps(best == 0.f ? 0.f : -INFINITY);
    }
    float b[8];
    _mm256_storeu_ps(b, bad);
    const bool finite = b[0] + b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] == 0.f;  // NaN otherwise
    if (!prune || finite) {
      *best_out = best, *at_out = at;
      return;
    }
  }
}

}  // namespace
}  // namespace decodescope::cpu
