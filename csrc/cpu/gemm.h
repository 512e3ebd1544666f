// GEMM for a few rows over weights packed in panels of 16 outputs (engine/weights, to_panels), one tile per
// format, written once over a SIMD vocabulary S (simd_avx2.h / simd_avx512.h) and compiled in each ISA's
// translation unit. Torch-free.
//
// Why panels: a 16-output panel is one 512-bit register of fp32, and its weights for input i sit side by
// side, so the inner step is acc[t] += w[p, i, :] * broadcast(x[t, i]): one weight load feeds one FMA per
// row. For the quantized formats the per-block scale work is amortized over 16 outputs x 32 inputs, and
// their activations are integers (int8, or 16 bits for q4 and q8: q16.h), so a block's sums are exact
// integer dot products (VNNI's 4 MACs a lane an instruction), far cheaper per row than FMAs on floats.
//
// Batch invariance: every tile computes a (row, output) with the same operations in the same order whatever
// the tile height, so a row's outputs are the same bits at every T: a decode step and any verify pass agree.
//
// Loop order per thread: panels outer (each panel's bytes stream from DRAM once), row tiles inner (a
// second tile of the same panel re-reads it from L1/L2). Tiles keep their accumulators in registers, so
// their height is bounded by the register file: kRows* below.
// Every loop over a tile's rows is unrolled (#pragma GCC unroll 8): left rolled, GCC kept a tile's y[] in
// memory as well and stored each row's sum to the stack every block (4-7% of a q4_a8 tile's time in L2).
#pragma once

#include <array>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "kquants.h"
#include "legacy.h"
#include "prefetch.h"
#include "q16.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct Gemm {
  using F = typename S::F;
  // Rows per tile, so that the accumulators (a 16-lane vector is 1 register on AVX-512, 2 on AVX2; the
  // integer tiles keep a block's sums per row besides) and a few temporaries fit the register file.
  static constexpr int kRowsDense = S::kRegs == 32 ? 8 : 6;
  static constexpr int kRowsQ16 = S::kRegs == 32 ? 8 : 2;
  static constexpr int kRowsI8 = S::kRegs == 32 ? 8 : 2;

  static void store_row(const LinearArgs& a, int64_t p, int row, F v) {
    float* dst = a.y + row * a.ldy + p * kPanel;
    const int64_t left = a.n_out - p * kPanel;
    if (left >= kPanel) S::store(dst, v);
    else S::store_n(dst, v, static_cast<int>(left));  // padded outputs are never written
  }

  // 16 stored weights -> fp32, exactly: fp16 and bf16 widen to the fp32 of the same value, so a model in either
  // gives the bits of its fp32 widening (the same chain of FMAs).
  struct Bf16 {
    uint16_t bits;
  };
  static F load(const float* w) { return S::load(w); }
  static F load(const uint16_t* w) { return S::load_f16(w); }
  static F load(const Bf16* w) { return S::load_bf16(reinterpret_cast<const uint16_t*>(w)); }

  // f32, f16 and bf16: w [P, in, 16]; a tile of R rows x NP panels. One accumulator chain per output, inputs in order,
  //   y = fma(w[in-1], x[in-1], ... fma(w[1], x[1], fma(w[0], x[0], +0)))
  // so the sum order does not depend on the row count. One chain waits on its FMA's latency (4 cycles) at
  // every input; the independent FMAs that hide it come from other panels (a 1-row tile streams 4 panels side
  // by side, a 2-row tile 2), not from splitting a row into several chains by T, which gave a decode step and
  // a verify pass different last bits.
  template <int R, int NP, class Weight>
  static void dense_tile(const LinearArgs& a, int64_t p, int r0) {
    const Weight* w[NP];
    for (int q = 0; q < NP; ++q) w[q] = static_cast<const Weight*>(a.w) + (p + q) * a.in * kPanel;
    const float* x = a.x + r0 * a.ldx;
    F acc[NP][R];
    for (int q = 0; q < NP; ++q)
      for (int r = 0; r < R; ++r) acc[q][r] = S::zero();
#pragma GCC unroll 2
    for (int i = 0; i < a.in; ++i) {
#pragma GCC unroll 4
      for (int q = 0; q < NP; ++q) {
        prefetch(w[q] + i * kPanel);
        const F wv = load(w[q] + i * kPanel);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[q][r] = S::fma(wv, S::set1(x[r * a.ldx + i]), acc[q][r]);
      }
    }
    for (int q = 0; q < NP; ++q)
      for (int r = 0; r < R; ++r) store_row(a, p + q, r0 + r, acc[q][r]);
  }

  // q4 (GGUF Q4_1 blocks) against 16-bit activations (q16.h): a block's four 64-byte chunks of nibbles are
  // VPDPBUSD operands once masked (S::q4_chunk), each row sums them exactly (S::q4_dot16), then fold_q4 with
  // the block's d and m, which follow its nibbles in the one weight stream (kernels.h).
  template <int R>
  static void q4_tile(const LinearArgs& a, int64_t p, int r0) {
    const Act16& x = *a.act;
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * a.nb * kQ4BlockBytes;
    F y[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      const uint8_t* wb = wp + b * kQ4BlockBytes;
      for (int line = 0; line < kQ4BlockBytes; line += 64) prefetch(wb + line);
      typename S::Q16Acc acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = S::q16_init(0);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const typename S::Q4Chunk w = S::q4_chunk(wb + c * kQ4Chunk);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) S::q4_dot16(acc[r], w, x, (r0 + r) * x.ld + b * kBlock + 8 * c);
      }
      const F dv = S::load_f16(reinterpret_cast<const uint16_t*>(wb + kQ4Nibbles));
      const F mv = S::load_f16(reinterpret_cast<const uint16_t*>(wb + kQ4Nibbles + 2 * kPanel));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int64_t s = (r0 + r) * a.nb + b;
        y[r] = fold_q4<S>(y[r], S::to_float(S::q16_sum(acc[r])), dv, mv, x.dx[s], x.xs[s]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // q4_a8: the same Q4_1 blocks against int8 activations (quantize_rows), as llama.cpp runs Q4_1 on Q8_1's: a
  // chunk's nibbles masked and shifted are the VPDPBUSD (AVX2: VPMADDUBSW) operands of inputs 8c..8c+3 and
  // 8c+4..8c+7, so a row's block is 8 instructions, half of the 16-bit halves' 16. A block's sum stays exact in
  // a Sub (a lane's pairs at most 8 * 2 * 15 * 127 = 30480 < 2^15), then fold_q4 with xs = dx * sum(qx), the
  // quantized block sum, as q16.h explains for 16 bits; dx and xs come ready per block and row (a.fold).
  //
  // A verify pass is bound by the VPDPBUSD port, which the fold's FMAs share (3 a row and block beside the 8
  // dot products; the masks, shifts, conversions and broadcast loads issue elsewhere): 6 rows of a block are
  // at least 66 of its cycles. The tile keeps everything else off the loop: on AVX-512 the chunks unrolled
  // (32 registers hold a block's sums), and the fold's factors one pointer away rather than recomputed per panel.
  static constexpr int kRowsA8 = S::kRegs == 32 ? 8 : 4;
  template <int R>
  static void a8_chunk(const LinearArgs& a, const uint8_t* wb, int b, int c, int r0, int64_t ldq,
                       typename S::Sub* acc) {
    const typename S::U8 q = S::u8_load(wb + c * kQ4Chunk);
    typename S::U8 wl, wh;
    KQuants<S>::nibbles(q, wl, wh);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = a.qx + (r0 + r) * ldq + b * kBlock + 8 * c;
      acc[r] = S::sub_dot(S::sub_dot(acc[r], wl, KQuants<S>::x4(xr)), wh, KQuants<S>::x4(xr + 4));
    }
  }
  template <int R>
  static void q4a8_tile(const LinearArgs& a, int64_t p, int r0) {
    static_assert(S::kSubSum >= 8 * 2 * 15 * 127);
    const uint8_t* wp = static_cast<const uint8_t*>(a.w) + p * a.nb * kQ4BlockBytes;
    const int64_t ldq = static_cast<int64_t>(a.nb) * kBlock;
    const typename S::SubScale one = S::sub_scale(S::i32_set1(1));
    F y[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      const uint8_t* wb = wp + b * kQ4BlockBytes;
      for (int line = 0; line < kQ4BlockBytes; line += 64) prefetch(wb + line);
      typename S::Sub acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = S::sub_zero();
      if constexpr (S::kRegs == 32) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a8_chunk<R>(a, wb, b, c, r0, ldq, acc);
      } else {
        // one chunk at a time: unrolled, GCC hoists every chunk's products ahead of their sums and spills them
#pragma GCC unroll 1
        for (int c = 0; c < 4; ++c) a8_chunk<R>(a, wb, b, c, r0, ldq, acc);
      }
      const F dv = S::load_f16(reinterpret_cast<const uint16_t*>(wb + kQ4Nibbles));
      const F mv = S::load_f16(reinterpret_cast<const uint16_t*>(wb + kQ4Nibbles + 2 * kPanel));
      const float* f = a.fold + 2 * (static_cast<int64_t>(b) * a.rows + r0);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        y[r] = fold_q4<S>(y[r], S::to_float(S::sub_scaled(acc[r], one)), dv, mv, f[2 * r], f[2 * r + 1]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // int8 (W8A8, as llama.cpp runs Q8_0): y = sum_b (d * dx) * (sum_i q * qx), the integer sums exact in int32.
  template <int R>
  static void i8_tile(const LinearArgs& a, int64_t p, int r0) {
    using I = typename S::I;
    const uint8_t* qs = static_cast<const uint8_t*>(a.w) + p * a.nb * kBlock * kPanel;
    const uint16_t* d = a.d + p * a.nb * kPanel;
    const int64_t ldq = static_cast<int64_t>(a.nb) * kBlock;
    const int8_t* qx = a.qx + r0 * ldq;
    F y[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      I acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = S::q8_init(S::kQ8Offset ? a.qoff[(r0 + r) * a.nb + b] : 0);
      const uint8_t* qb = qs + b * kBlock * kPanel;
      prefetch(d + b * kPanel, kPrefetch / 16);  // scales: 1/16 of the bytes' pace
#pragma GCC unroll 8
      for (int g = 0; g < kBlock / 4; ++g) {
        prefetch(qb + g * 4 * kPanel);
        const typename S::Q8W w = S::q8_load(qb + g * 4 * kPanel);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          int32_t x4;
          std::memcpy(&x4, qx + r * ldq + b * kBlock + 4 * g, 4);
          acc[r] = S::q8_dot(acc[r], w, x4);
        }
      }
      const F dv = S::load_f16(d + b * kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        y[r] = S::fma(S::to_float(acc[r]), S::mul(dv, S::set1(a.dx[(r0 + r) * a.nb + b])), y[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // q8 (Q8_0 blocks: a q4 model's LM head) against 16-bit activations: the int8 layout's groups of 16 outputs
  // x 4 inputs, exact sums (S::q8_dot16), then fold_q8.
  template <int R>
  static void q8_tile(const LinearArgs& a, int64_t p, int r0) {
    const Act16& x = *a.act;
    const uint8_t* qs = static_cast<const uint8_t*>(a.w) + p * a.nb * kBlock * kPanel;
    const uint16_t* d = a.d + p * a.nb * kPanel;
    F y[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      const uint8_t* qb = qs + b * kBlock * kPanel;
      prefetch(d + b * kPanel, kPrefetch / 16);
      typename S::Q16Acc acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = S::q16_init(x.shi[(r0 + r) * a.nb + b]);
#pragma GCC unroll 8
      for (int g = 0; g < kBlock / 4; ++g) {
        prefetch(qb + g * 4 * kPanel);
        const typename S::Q8Group w = S::q8_group(qb + g * 4 * kPanel);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) S::q8_dot16(acc[r], w, x, (r0 + r) * x.ld + b * kBlock + 4 * g);
      }
      const F dv = S::load_f16(d + b * kPanel);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        y[r] = fold_q8<S>(y[r], S::to_float(S::q16_sum(acc[r])), dv, x.dx[(r0 + r) * a.nb + b]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // Tag types naming a format's tile, so one loop and one dispatch serve all of them (no lambdas here: GCC
  // does not apply the translation unit's `#pragma GCC target` to them).
  struct F32 {};
  struct F16 {};
  struct BF16 {};
  struct Q4 {};
  struct Q4A8 {};
  struct I8 {};
  struct Q8 {};
  struct Q4_0 {};
  struct Q5_0 {};
  struct Q5_1 {};

  template <class K, int R>
  static void tile(const LinearArgs& a, int64_t p, int r0) {
    if constexpr (std::is_same_v<K, F32>) dense_tile<R, 1, float>(a, p, r0);
    else if constexpr (std::is_same_v<K, F16>) dense_tile<R, 1, uint16_t>(a, p, r0);
    else if constexpr (std::is_same_v<K, BF16>) dense_tile<R, 1, Bf16>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q4>) q4_tile<R>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q4A8>) q4a8_tile<R>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q8>) q8_tile<R>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q4_0>) Legacy<S>::template tile<R, typename Legacy<S>::Q4_0>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q5_0>) Legacy<S>::template tile<R, typename Legacy<S>::Q5_0>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q5_1>) Legacy<S>::template tile<R, typename Legacy<S>::Q5_1>(a, p, r0);
    else i8_tile<R>(a, p, r0);
  }

  // tile<K, r> for the runtime r in [1, R]: each height is its own instantiation, so the row loops unroll
  // and the accumulators stay in registers.
  template <class K, int R>
  static void tile_rows(int r, const LinearArgs& a, int64_t p, int r0) {
    if constexpr (R >= 1) {
      if (r == R) return tile<K, R>(a, p, r0);
      tile_rows<K, R - 1>(r, a, p, r0);
    }
  }

  template <class K, int Rows>
  static void panels(const LinearArgs& a, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int r0 = 0; r0 < a.rows; r0 += Rows) tile_rows<K, Rows>(a.rows - r0 < Rows ? a.rows - r0 : Rows, a, p, r0);
  }

  // Dense: 1- and 2-row passes take their panels 4 and 2 at a time (dense_tile), the rest one at a time.
  template <class K, class Weight>
  static void dense_panels(const LinearArgs& a, int64_t p0, int64_t p1) {
    int64_t p = p0;
    if (a.rows == 1)
      for (; p + 4 <= p1; p += 4) dense_tile<1, 4, Weight>(a, p, 0);
    else if (a.rows == 2)
      for (; p + 2 <= p1; p += 2) dense_tile<2, 2, Weight>(a, p, 0);
    panels<K, kRowsDense>(a, p, p1);
  }

  static void linear_f32(const LinearArgs& a, int64_t p0, int64_t p1) { dense_panels<F32, float>(a, p0, p1); }
  static void linear_f16(const LinearArgs& a, int64_t p0, int64_t p1) { dense_panels<F16, uint16_t>(a, p0, p1); }
  static void linear_bf16(const LinearArgs& a, int64_t p0, int64_t p1) { dense_panels<BF16, Bf16>(a, p0, p1); }
  static void linear_q4(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q4, kRowsQ16>(a, p0, p1); }
  static void linear_q4_a8(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q4A8, kRowsA8>(a, p0, p1); }
  static void linear_int8(const LinearArgs& a, int64_t p0, int64_t p1) { panels<I8, kRowsI8>(a, p0, p1); }
  static void linear_q8(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q8, kRowsQ16>(a, p0, p1); }
  // K-quants: their own loop (kquants.h), which unpacks a super-block once for all the rows of a verify pass
  static constexpr LinearFn linear_q2k = KQuants<S>::template linear<2>;
  static constexpr LinearFn linear_q3k = KQuants<S>::template linear<3>;
  static constexpr LinearFn linear_q4k = KQuants<S>::template linear<4>;
  static constexpr LinearFn linear_q5k = KQuants<S>::template linear<5>;
  static constexpr LinearFn linear_q6k = KQuants<S>::template linear<6>;
  static void linear_q4_0(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q4_0, Legacy<S>::kRows>(a, p0, p1); }
  static void linear_q5_0(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q5_0, Legacy<S>::kRows>(a, p0, p1); }
  static void linear_q5_1(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q5_1, Legacy<S>::kRows>(a, p0, p1); }
  static constexpr QuantizeRowsKFn quantize_rows_k = KQuants<S>::quantize_rows_k;

  // KernelTable::linear: each format's kernel at its code.
  static constexpr std::array<LinearFn, kNumFormats> linears() {
    std::array<LinearFn, kNumFormats> t{};
    t[kFp32] = linear_f32;
    t[kFp16] = linear_f16;
    t[kBf16] = linear_bf16;
    t[kInt8] = linear_int8;
    t[kQ8] = linear_q8;
    t[kQ4] = linear_q4;
    t[kQ4A8] = linear_q4_a8;
    t[kQ2K] = linear_q2k;
    t[kQ3K] = linear_q3k;
    t[kQ4K] = linear_q4k;
    t[kQ5K] = linear_q5k;
    t[kQ6K] = linear_q6k;
    t[kQ4_0] = linear_q4_0;
    t[kQ5_0] = linear_q5_0;
    t[kQ5_1] = linear_q5_1;
    return t;
  }

  // The recipe of engine/ops/ref.py quantize_activations, bit for bit: per row and block of 32, block_scales
  // (q16.h: blocks holding inf or NaN, and blocks too small to scale, are defined there), qx =
  // round_half_even(x * inv), dx; x past `in` counts as 0. qoff = -128 * sum(qx) cancels the weights' +128
  // offset (see S::q8_dot). Blocks go 16 at a time, as block_scales takes them, their sums of qx through one tree.
  static void quantize_rows(const float* x, int64_t ldx, int in, int nb, int8_t* qx, float* dx, int32_t* qoff,
                            int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int b0 = 0; b0 < nb; b0 += kScaleGroup) {
        F v0[kScaleGroup], v1[kScaleGroup], sums[kScaleGroup];
        alignas(64) float inv[kScaleGroup], d[kScaleGroup], sum[kScaleGroup];
        const int n = block_scales<S>(x + r * ldx, in, nb, b0, 127.f, v0, v1, inv, d);
        for (int k = 0; k < kScaleGroup; ++k) {
          if (k >= n) {
            sums[k] = S::zero();
            continue;
          }
          const F q0 = S::round(S::mul(v0[k], S::set1(inv[k]))), q1 = S::round(S::mul(v1[k], S::set1(inv[k])));
          int8_t* dst = qx + r * static_cast<int64_t>(nb) * kBlock + (b0 + k) * kBlock;
          S::store_i8(dst, q0);
          S::store_i8(dst + 16, q1);
          sums[k] = S::add(q0, q1);
        }
        S::store(sum, S::hsum16(sums));  // integers: exact in any order, |sum| < 2^24
        for (int k = 0; k < n; ++k) {
          dx[r * nb + b0 + k] = d[k];
          qoff[r * nb + b0 + k] = -128 * static_cast<int32_t>(sum[k]);
        }
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
