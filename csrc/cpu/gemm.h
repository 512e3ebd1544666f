// GEMM for a few rows over weights packed in panels of 16 outputs (engine/weights.py, to_panels), one
// routine per format, written once over a SIMD vocabulary S (simd_avx2.h / simd_avx512.h) and compiled
// in each ISA's translation unit. Torch-free.
//
// Why panels: a 16-output panel is one 512-bit register of fp32, and its weights for input i sit side by
// side, so the inner step is acc[t] += w[p, i, :] * broadcast(x[t, i]): one weight load feeds one FMA per
// row. For the quantized formats the per-block scale work (converting d, m and the block's sum) is
// amortized over 16 outputs x 32 inputs, not paid per output. A pass over T rows therefore costs about
// T cheap FMAs (or VNNI dot instructions) per weight load, and as long as those fit under the time the
// weight bytes take to arrive from DRAM, a 6-row verify pass costs about what a 1-row decode step does.
//
// Loop order per thread: panels outer (each panel's bytes stream from DRAM once), row tiles inner (a
// second tile of the same panel re-reads it from L1/L2). Tiles keep their accumulators in registers, so
// their height is bounded by the register file: kRows* below.
#pragma once

#include <array>
#include <cstring>
#include <type_traits>

#include "kernels.h"

namespace decodescope::cpu {
namespace {

// Software prefetch of the weight stream, kPrefetch bytes ahead, into L2 (prefetcht1). A tile with two or
// more rows is compute-bound per panel (T FMAs per weight load), and without it the core stops issuing
// loads while it computes: with the hardware prefetcher alone a 6-row f16 step took nearly twice as long
// (8 KB ahead measured best; 1, 2 and 4 KB ahead and prefetcht0 all did worse). 1-row tiles gain too, in
// whole decode steps (a kernel timed alone in a loop finds part of its weights still in L3): the hardware
// prefetcher stops at each 4 KB page, the software one runs on across it.
constexpr int kPrefetch = 8192;
inline void prefetch(const void* p, int ahead = kPrefetch) {
  __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 2);
}

template <class S>
struct Gemm {
  using F = typename S::F;
  // Rows per tile, so that the accumulators (a 16-lane vector is 1 register on AVX-512, 2 on AVX2; the
  // quantized formats also keep a per-block sum per row) and a few temporaries fit the register file.
  static constexpr int kRowsDense = S::kRegs == 32 ? 8 : 6;
  static constexpr int kRowsQ4 = S::kRegs == 32 ? 8 : 2;
  static constexpr int kRowsI8 = S::kRegs == 32 ? 8 : 2;

  // Independent accumulator chains for a tile of R rows: with one row, consecutive FMAs into one register
  // would wait on each other's latency (4 cycles) and cap the stream below what memory delivers.
  template <int R>
  static constexpr int chains() { return R == 1 ? 4 : R == 2 ? 2 : 1; }

  static int outputs_in(const LinearArgs& a, int64_t p) {
    const int64_t left = a.n_out - p * kPanel;
    return left < kPanel ? static_cast<int>(left) : kPanel;
  }

  static void store_row(const LinearArgs& a, int64_t p, int row, F v) {
    float* dst = a.y + row * a.ldy + p * kPanel;
    const int n = outputs_in(a, p);
    if (n == kPanel) S::store(dst, v);
    else S::store_n(dst, v, n);  // padded outputs are never written
  }

  // 16 stored weights -> fp32.
  static F load(const float* w) { return S::load(w); }
  static F load(const uint16_t* w) { return S::load_f16(w); }

  // f32 and f16: w [P, in, 16].
  template <int R, class Weight>
  static void dense_tile(const LinearArgs& a, int64_t p, int r0) {
    const Weight* w = static_cast<const Weight*>(a.w) + p * a.in * kPanel;
    constexpr int C = chains<R>();
    const float* x = a.x + r0 * a.ldx;
    F acc[C][R];
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r) acc[c][r] = S::zero();
    int i = 0;
    for (; i + C <= a.in; i += C) {
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        prefetch(w + (i + c) * kPanel);
        const F wv = load(w + (i + c) * kPanel);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[c][r] = S::fma(wv, S::set1(x[r * a.ldx + i + c]), acc[c][r]);
      }
    }
    for (; i < a.in; ++i) {
      const F wv = load(w + i * kPanel);
      for (int r = 0; r < R; ++r) acc[0][r] = S::fma(wv, S::set1(x[r * a.ldx + i]), acc[0][r]);
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 1; c < C; ++c) acc[0][r] = S::add(acc[0][r], acc[c][r]);
      store_row(a, p, r0 + r, acc[0][r]);
    }
  }

  // q4: y = sum_b d * (sum_i q x) + m * (sum_i x). The nibble sums run in fp32 on q in 0..15 (exact
  // products, rounding only in the sums), low and high nibbles in separate chains. With fp32 activations
  // a T-row pass costs T FMAs per 16 weights on top of the unpack, against 5 bits of memory per weight: q4
  // is compute-bound by design (at T = 6 the FMAs alone outlast the weights' stream from DRAM), where the
  // other formats stay memory-bound.
  template <int R>
  static void q4_tile(const LinearArgs& a, int64_t p, int r0) {
    const uint8_t* qs = static_cast<const uint8_t*>(a.w) + p * a.nb * (kBlock / 2) * kPanel;
    const uint16_t* d = a.d + p * a.nb * kPanel;
    const uint16_t* m = a.m + p * a.nb * kPanel;
    const float* x = a.x + r0 * a.ldx;
    const float* xsum = a.xsum + r0 * a.nb;
    constexpr int C = R == 1 ? 2 : 1;  // 2 x (lo, hi) chains for a single row
    F y[R];
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      F lo_acc[C][R], hi_acc[C][R];
      for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) lo_acc[c][r] = hi_acc[c][r] = S::zero();
      const uint8_t* qb = qs + b * (kBlock / 2) * kPanel;
      const float* xb = x + b * kBlock;
      for (int line = 0; line < kBlock / 2 * kPanel; line += 64) prefetch(qb + line);
      prefetch(d + b * kPanel, kPrefetch / 8);  // the scales advance 1/8 as fast as the nibbles
      prefetch(m + b * kPanel, kPrefetch / 8);
#pragma GCC unroll 4
      for (int i2 = 0; i2 < kBlock / 2; i2 += C) {
#pragma GCC unroll 2
        for (int c = 0; c < C; ++c) {
          F lo, hi;
          S::load_nibbles(qb + (i2 + c) * kPanel, lo, hi);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            lo_acc[c][r] = S::fma(lo, S::set1(xb[r * a.ldx + 2 * (i2 + c)]), lo_acc[c][r]);
            hi_acc[c][r] = S::fma(hi, S::set1(xb[r * a.ldx + 2 * (i2 + c) + 1]), hi_acc[c][r]);
          }
        }
      }
      const F dv = S::load_f16(d + b * kPanel), mv = S::load_f16(m + b * kPanel);
      for (int r = 0; r < R; ++r) {
        F s = S::add(lo_acc[0][r], hi_acc[0][r]);
        for (int c = 1; c < C; ++c) s = S::add(s, S::add(lo_acc[c][r], hi_acc[c][r]));
        y[r] = S::fma(dv, s, y[r]);
        y[r] = S::fma(mv, S::set1(xsum[r * a.nb + b]), y[r]);
      }
    }
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
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      I acc[R];
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
      for (int r = 0; r < R; ++r)
        y[r] = S::fma(S::to_float(acc[r]), S::mul(dv, S::set1(a.dx[(r0 + r) * a.nb + b])), y[r]);
    }
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // q8, the activations exact (the LM head of a q4 model, so q4 stays lossless): int8 panels as for int8,
  // each input's weights converted to fp32 exactly (load_q8_inputs), y = sum_b d * (sum_i q x): the
  // dequantize twin's arithmetic up to the order of the sums. Compute-bound at T >= 2, like q4.
  template <int R>
  static void q8_tile(const LinearArgs& a, int64_t p, int r0) {
    const uint8_t* qs = static_cast<const uint8_t*>(a.w) + p * a.nb * kBlock * kPanel;
    const uint16_t* d = a.d + p * a.nb * kPanel;
    const float* x = a.x + r0 * a.ldx;
    constexpr int C = R == 1 ? 4 : R == 2 ? 2 : 1;  // independent chains, as in dense_tile
    F y[R];
    for (int r = 0; r < R; ++r) y[r] = S::zero();
    for (int b = 0; b < a.nb; ++b) {
      F acc[C][R];
      for (int c = 0; c < C; ++c)
        for (int r = 0; r < R; ++r) acc[c][r] = S::zero();
      const uint8_t* qb = qs + b * kBlock * kPanel;
      const float* xb = x + b * kBlock;
      for (int line = 0; line < kBlock * kPanel; line += 64) prefetch(qb + line);
      prefetch(d + b * kPanel, kPrefetch / 16);
#pragma GCC unroll 8
      for (int g = 0; g < kBlock / 4; ++g) {
        F w[4];
        S::load_q8_inputs(qb + g * 4 * kPanel, w);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            F& chain = acc[(4 * g + j) % C][r];
            chain = S::fma(w[j], S::set1(xb[r * a.ldx + 4 * g + j]), chain);
          }
        }
      }
      const F dv = S::load_f16(d + b * kPanel);
      for (int r = 0; r < R; ++r) {
        F s = acc[0][r];
        for (int c = 1; c < C; ++c) s = S::add(s, acc[c][r]);
        y[r] = S::fma(dv, s, y[r]);
      }
    }
    for (int r = 0; r < R; ++r) store_row(a, p, r0 + r, y[r]);
  }

  // Tag types naming a format's tile, so one loop and one dispatch serve all four (no lambdas here: GCC
  // does not apply the translation unit's `#pragma GCC target` to them).
  struct F32 {};
  struct F16 {};
  struct Q4 {};
  struct I8 {};
  struct Q8 {};

  template <class K, int R>
  static void tile(const LinearArgs& a, int64_t p, int r0) {
    if constexpr (std::is_same_v<K, F32>) dense_tile<R, float>(a, p, r0);
    else if constexpr (std::is_same_v<K, F16>) dense_tile<R, uint16_t>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q4>) q4_tile<R>(a, p, r0);
    else if constexpr (std::is_same_v<K, Q8>) q8_tile<R>(a, p, r0);
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

  static void linear_f32(const LinearArgs& a, int64_t p0, int64_t p1) { panels<F32, kRowsDense>(a, p0, p1); }
  static void linear_f16(const LinearArgs& a, int64_t p0, int64_t p1) { panels<F16, kRowsDense>(a, p0, p1); }
  static void linear_q4(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q4, kRowsQ4>(a, p0, p1); }
  static void linear_int8(const LinearArgs& a, int64_t p0, int64_t p1) { panels<I8, kRowsI8>(a, p0, p1); }
  static void linear_q8(const LinearArgs& a, int64_t p0, int64_t p1) { panels<Q8, kRowsQ4>(a, p0, p1); }

  // KernelTable::linear: each format's kernel at its code.
  static constexpr std::array<LinearFn, kNumFormats> linears() {
    std::array<LinearFn, kNumFormats> t{};
    t[kFp32] = linear_f32;
    t[kFp16] = linear_f16;
    t[kInt8] = linear_int8;
    t[kQ8] = linear_q8;
    t[kQ4] = linear_q4;
    return t;
  }

  // The recipe of engine/ops/ref.py quantize_activations, bit for bit: per row and block of 32, amax,
  // inv = 127 / amax, qx = round_half_even(x * inv), dx = amax / 127 (all fp32; zeros for a zero block);
  // x past `in` counts as 0. qoff = -128 * sum(qx) cancels the weights' +128 offset (see S::q8_dot).
  static void quantize_rows(const float* x, int64_t ldx, int in, int nb, int8_t* qx, float* dx, int32_t* qoff,
                            int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * ldx;
      for (int b = 0; b < nb; ++b) {
        const int left = in - b * kBlock;
        const F v0 = left >= 16 ? S::load(xr + b * kBlock) : S::load_n(xr + b * kBlock, left);
        const F v1 = left >= 32 ? S::load(xr + b * kBlock + 16)
                                : S::load_n(xr + b * kBlock + 16, left > 16 ? left - 16 : 0);
        const float amax = S::reduce_max(S::max(S::abs(v0), S::abs(v1)));
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        const F q0 = S::round(S::mul(v0, S::set1(inv))), q1 = S::round(S::mul(v1, S::set1(inv)));
        int8_t* dst = qx + r * static_cast<int64_t>(nb) * kBlock + b * kBlock;
        S::store_i8(dst, q0);
        S::store_i8(dst + 16, q1);
        dx[r * nb + b] = amax / 127.f;
        qoff[r * nb + b] = -128 * static_cast<int32_t>(S::reduce_add(S::add(q0, q1)));  // exact: |sum| < 2^24
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
