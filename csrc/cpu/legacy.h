// GGUF Q4_0, Q5_0 and Q5_1 over panels that are the file's blocks of 16 rows interleaved (kernels.h), against the
// int8 activations of Q8_0 (LinearArgs qx, dx, qoff; Q5_1: Q8_1's, with fold), as llama.cpp runs them. Written
// once over a SIMD vocabulary S (gemm.h dispatches to them). Torch-free.
//
// The quants are stored unsigned (q + 8, or q + 16 with Q5_0's fifth bit), the form VPDPBUSD multiplies, and
// the offset leaves through the activations' block sum: qoff = -128 sum(qx), so a block's exact integer is
//   S = sum_i (u_i - 8) qx_i = sum_i u_i qx_i + qoff / 16      (Q5_0: - 16, + qoff / 8)
// and one fold per block remains, int8's: y += float(S) fl(d dx), |S| <= 32 * 16 * 127 < 2^24 so float(S) is
// exact. Q5_1's quants are unsigned already (w = d u + m): S = sum_i u_i qx_i, and its min folds through the
// block's quantized sum as q4_a8's (q16.h fold_q4, with LinearArgs fold's dx and xs).
// Every path computes the same integers and folds them in block order: batch invariance as int8's.
// In a block of the file, byte l holds element l in its low nibble and l + 16 in its high one, so group g of
// 4 bytes feeds inputs 4g.. and 16 + 4g..; the fifth bits are one little-endian 32-bit mask a row, bit i
// element i's: the 16 rows' masks are one vector, lane j row j's.
#pragma once

#include <cstdint>

#include "kernels.h"
#include "kquant_base.h"
#include "prefetch.h"
#include "q16.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct Legacy {
  using F = typename S::F;
  using I = typename S::I;
  using U8 = typename S::U8;
  using K = KQuantBase<S>;  // its row store and 4-byte activation loads
  static constexpr int kRows = S::kRegs == 32 ? 8 : 2;

  // Where a block's fields lie in its panel (kernels.h): the 16 rows' d, then their m (Q5_1), their fifth-bit masks
  // (Q5_0, Q5_1), then the quants' 4 groups; kOffset is what the stored quants carry over the signed ones.
  struct Q4_0 {
    static constexpr int kBytes = kQ4_0Bytes, kMin = 0, kMask = 0, kQs = 32, kOffset = 8;
  };
  struct Q5_0 {
    static constexpr int kBytes = kQ5_0Bytes, kMin = 0, kMask = 32, kQs = 96, kOffset = 16;
  };
  struct Q5_1 {
    static constexpr int kBytes = kQ5_1Bytes, kMin = 32, kMask = 64, kQs = 128, kOffset = 0;
  };

  template <int R, class B>
  static void tile(const LinearArgs& a, int64_t p, int r0) {
    static_assert(B::kOffset == 0 || B::kOffset == 8 || B::kOffset == 16);
    constexpr int kShift = B::kOffset == 16 ? 3 : 4;  // qoff * kOffset / 128, exact: 128 | qoff
    const int64_t ldq = static_cast<int64_t>(a.nb) * kBlock;
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * a.nb * B::kBytes;
    F y[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      const uint8_t* wb = wp + static_cast<int64_t>(b) * B::kBytes;
      for (int line = 0; line < B::kBytes; line += 64) prefetch(wb + line);
      I acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[r] = S::i32_set1(B::kOffset ? a.qoff[(r0 + r) * a.nb + b] >> kShift : 0);
      I mask;
      if constexpr (B::kMask > 0) mask = S::i32_load(wb + B::kMask);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        const U8 q = S::u8_load(wb + B::kQs + 64 * g);
        U8 wl, wh;
        K::nibbles(q, wl, wh);
        if constexpr (B::kMask > 0) {
          wl = S::u8_or(wl, S::fifth_bits(mask, 4 * g));
          wh = S::u8_or(wh, S::fifth_bits(mask, 16 + 4 * g));
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = a.qx + (r0 + r) * ldq + b * kBlock + 4 * g;
          acc[r] = S::dot_u8s8(S::dot_u8s8(acc[r], wl, K::x4(xr)), wh, K::x4(xr + 16));
        }
      }
      const F d = S::load_f16(reinterpret_cast<const uint16_t*>(wb));
      if constexpr (B::kMin > 0) {
        const F m = S::load_f16(reinterpret_cast<const uint16_t*>(wb + B::kMin));
        const float* f = a.fold + 2 * (static_cast<int64_t>(b) * a.rows + r0);  // dx and xs, the rows side by side
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) y[r] = fold_q4<S>(y[r], S::to_float(acc[r]), d, m, f[2 * r], f[2 * r + 1]);
      } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          y[r] = S::fma(S::to_float(acc[r]), S::mul(d, S::set1(a.dx[(r0 + r) * a.nb + b])), y[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) K::store_row(a, p, r0 + r, y[r]);
  }
};

}  // namespace
}  // namespace decodescope::cpu
