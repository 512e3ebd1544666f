// What the quantized GEMMs do with their activations, written once over a SIMD vocabulary S and shared by
// every path (gemm.h's tiles, amx.h's tiles): the per-block scale rules, the 16-bit prep and the float fold.
// Torch-free; engine/ops/ref.py's twins follow the same recipes.
//
// Why 16-bit activations for q4 and q8: with fp32 activations a q4 tile pays one FMA per weight per row (16
// MACs an instruction), so a verify pass of T rows costs about T times a decode step's compute. Quantized per
// row and block of 32 to x16 = round_half_even(x * 32767 / amax), a block's dot product is an exact integer
// S = sum_i q_i x16_i (64 MACs a VPDPBUSD, 1024 an AMX tile op), and one float fold per block remains:
//
//   y[t, n] = sum_b  fl(d[n,b] * dx[t,b]) * S[t,n,b]  +  m[n,b] * xs[t,b]        (q8: no m term)
//
// xs = dx * sum(x16) is the *quantized* block sum, not the exact sum of x: then y is the weights' dot product
// with the dequantized activation dx * x16, and the error sum_i w_i (x_i - dx x16_i) is over the centred weights
// (|w| <~ 8d); with the exact sum it would be over d * q_i, q in 0..15 not centred, about twice as large
// (ggml's Q8_1 keeps the quantized sum for the same reason). Error: within 2^-16 of each block's largest |x|
// per input, about 3e-5 of an output's size on the default model.
//
// Batch invariance: S is an exact integer whichever instruction, tile or thread computed it, and every path
// then runs fold_q4 / fold_q8 below, blocks ascending from y = +0, so a row's outputs are the same bits at
// every T, tile height, thread split and ISA (AVX2's 8-lane halves do the same per-lane operations).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "kernels.h"

namespace decodescope::cpu {
namespace {

// The scale of one block of 32 for a quantizer to [-qmax, qmax] (127: int8, 32767: 16 bits): inv = qmax / amax,
// dx = amax / qmax, all in scalar fp32 so every ISA computes the same bits. Defined for every input:
//  * a block holding inf or NaN quantizes to zeros with dx = NaN, so every output of its row is NaN, as a
//    float matmul of that row gives inf or NaN (v0, v1 are zeroed here so no lane converts a NaN);
//  * a block whose qmax / amax overflows (all zeros, denormals, or amax below qmax / FLT_MAX: 3.7e-37 for int8,
//    9.6e-35 for 16 bits) quantizes to zeros with dx = 0: it contributes nothing.
struct BlockScale {
  float inv, dx;
};
template <class S>
BlockScale block_scale(typename S::F& v0, typename S::F& v1, float qmax) {
  if (S::nonfinite(v0, v1) != 0.f) {  // NaN != 0
    v0 = v1 = S::zero();
    return {0.f, NAN};
  }
  const float amax = S::reduce_max(S::max(S::abs(v0), S::abs(v1)));  // exact in any order
  const float inv = qmax / amax;
  if (!(inv <= FLT_MAX)) return {0.f, 0.f};
  return {inv, amax / qmax};
}

// The 32 values of block b of row xr (x past `in` counts as 0).
template <class S>
void load_block(const float* xr, int in, int b, typename S::F& v0, typename S::F& v1) {
  const int left = in - b * kBlock;
  v0 = left >= 16 ? S::load(xr + b * kBlock) : S::load_n(xr + b * kBlock, left > 0 ? left : 0);
  v1 = left >= 32 ? S::load(xr + b * kBlock + 16) : S::load_n(xr + b * kBlock + 16, left > 16 ? left - 16 : 0);
}

// The 16-bit prep, rows [r0, r1): x16, dx, xs, sum16 and shi per block, and the planes this ISA reads
// (S::store_x16). x16 = round_half_even(x * inv) lane by lane: the same IEEE operations on every ISA.
template <class S>
void quantize_rows16(const float* x, int64_t ldx, int in, int nb, const Act16& a, int64_t r0, int64_t r1) {
  using F = typename S::F;
  for (int64_t r = r0; r < r1; ++r) {
    for (int b = 0; b < nb; ++b) {
      F v0, v1;
      load_block<S>(x + r * ldx, in, b, v0, v1);
      const BlockScale sc = block_scale<S>(v0, v1, 32767.f);
      const F q0 = S::round(S::mul(v0, S::set1(sc.inv))), q1 = S::round(S::mul(v1, S::set1(sc.inv)));
      const int64_t s = r * nb + b;
      S::store_x16(q0, q1, a, r * a.ld + b * kBlock, a.sum16[s], a.shi[s]);
      a.dx[s] = sc.dx;
      a.xs[s] = sc.dx * static_cast<float>(a.sum16[s]);  // |sum| <= 32 * 32767 < 2^24: exact before the product
    }
  }
}

// The fold every path runs per block and (row, 16 outputs). float(S) is exact for q4 (|S| <= 32 * 15 * 32767
// < 2^24) and one rounding of an exact int32 for q8.
template <class S>
typename S::F fold_q4(typename S::F y, typename S::F s, typename S::F d, typename S::F m, float dx, float xs) {
  y = S::fma(s, S::mul(d, S::set1(dx)), y);
  return S::fma(m, S::set1(xs), y);
}
template <class S>
typename S::F fold_q8(typename S::F y, typename S::F s, typename S::F d, float dx) {
  return S::fma(s, S::mul(d, S::set1(dx)), y);
}

}  // namespace
}  // namespace decodescope::cpu
