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

// The 32 values of block b of row xr (x past `in` counts as 0).
template <class S>
void load_block(const float* xr, int in, int b, typename S::F& v0, typename S::F& v1) {
  const int left = in - b * kBlock;
  v0 = left >= 16 ? S::load(xr + b * kBlock) : S::load_n(xr + b * kBlock, left > 0 ? left : 0);
  v1 = left >= 32 ? S::load(xr + b * kBlock + 16) : S::load_n(xr + b * kBlock + 16, left > 16 ? left - 16 : 0);
}

// The quantizers' shared first half (gemm.h quantize_rows, quantize_rows16 below): loads the blocks of row xr from
// block b0 on, at most kScaleGroup of them, into v0[k], v1[k], and returns how many (nb - b0, at most 16), with each
// one's scale for a quantizer to [-qmax, qmax] (127: int8, 32767: 16 bits): inv = qmax / amax, dx = amax / qmax, in
// fp32 IEEE operations so every ISA computes the same bits. Defined for every input:
//  * a block holding inf or NaN quantizes to zeros with dx = NaN, so every output of its row is NaN, as a
//    float matmul of that row gives inf or NaN (its v0, v1 are zeroed here so no lane converts a NaN);
//  * a block whose qmax / amax overflows (all zeros, denormals, or amax below qmax / FLT_MAX: 3.7e-37 for int8,
//    9.6e-35 for 16 bits) quantizes to zeros with dx = 0: it contributes nothing.
// The 16 go together: one max tree and one sum tree across them (a max, or a sum of zeros and NaNs, is the same in
// any order) and two vector divisions (IEEE division rounds the same at any width). One block at a time, each
// block's horizontal reductions and scalar divisions formed a latency chain that was most of a verify pass's
// quantization.
constexpr int kScaleGroup = 16;
template <class S>
int block_scales(const float* xr, int in, int nb, int b0, float qmax, typename S::F* v0, typename S::F* v1, float* inv,
                 float* dx) {
  using F = typename S::F;
  const int n = nb - b0 < kScaleGroup ? nb - b0 : kScaleGroup;
  for (int k = 0; k < n; ++k) load_block<S>(xr, in, b0 + k, v0[k], v1[k]);
  F zeros[kScaleGroup], m[kScaleGroup];
  for (int k = 0; k < kScaleGroup; ++k) {
    zeros[k] = k < n ? S::add(S::mul(v0[k], S::zero()), S::mul(v1[k], S::zero())) : S::zero();  // NaN where not finite
    m[k] = k < n ? S::max(S::abs(v0[k]), S::abs(v1[k])) : S::zero();
  }
  const F nan_sum = S::hsum16(zeros);
  const unsigned finite = S::ge_bits(nan_sum, nan_sum);  // NaN compares false
  for (int k = 0; k < n; ++k)
    if (!(finite >> k & 1u)) v0[k] = v1[k] = m[k] = S::zero();
  const F amax = S::hmax16(m);
  const F iv = S::div(S::set1(qmax), amax);
  const unsigned fits = S::ge_bits(S::set1(FLT_MAX), iv);  // inv <= FLT_MAX
  S::store(inv, iv);
  S::store(dx, S::div(amax, S::set1(qmax)));
  for (int k = 0; k < n; ++k) {
    if (!(finite >> k & 1u)) inv[k] = 0.f, dx[k] = NAN;
    else if (!(fits >> k & 1u)) inv[k] = 0.f, dx[k] = 0.f;
  }
  return n;
}

// The 16-bit prep, rows [r0, r1): x16, dx, xs, sum16 and shi per block, and the planes this ISA reads
// (S::store_x16). x16 = round_half_even(x * inv) lane by lane: the same IEEE operations on every ISA.
template <class S>
void quantize_rows16(const float* x, int64_t ldx, int in, int nb, const Act16& a, int64_t r0, int64_t r1) {
  using F = typename S::F;
  for (int64_t r = r0; r < r1; ++r) {
    for (int b0 = 0; b0 < nb; b0 += kScaleGroup) {
      F v0[kScaleGroup], v1[kScaleGroup];
      alignas(64) float inv[kScaleGroup], dx[kScaleGroup];
      const int n = block_scales<S>(x + r * ldx, in, nb, b0, 32767.f, v0, v1, inv, dx);
      for (int k = 0; k < n; ++k) {
        const F q0 = S::round(S::mul(v0[k], S::set1(inv[k]))), q1 = S::round(S::mul(v1[k], S::set1(inv[k])));
        const int64_t s = r * nb + b0 + k;
        S::store_x16(q0, q1, a, r * a.ld + (b0 + k) * kBlock, a.sum16[s], a.shi[s]);
        a.dx[s] = dx[k];
        a.xs[s] = dx[k] * static_cast<float>(a.sum16[s]);  // |sum| <= 32 * 32767 < 2^24: exact before the product
      }
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
