// Weight-only int8 (GGUF Q8_0), q4 (GGUF Q4_1) and dense fp16 / bf16 products for a decode step and a verify pass
// (engine/ops/cuda.py routes up to 17 rows here, more to cuBLAS, the block formats after dequantize.cuh):
// out [T, out] = x [T, in] @ W^T, W converted in registers, fp32 accumulation, one rounding to x's dtype. Launches
// take up to 16 tokens; more run as tiles of 16.
//
// Every output is reduced in one order whatever T: a lane owns the same columns of every 512-column chunk at
// every token tile (kCols is fixed, only the staging of x changes with kT), adds them chunk by chunk, and the
// row's lanes add up in one butterfly. So a position's logits are the same bits in a decode step and in a verify
// pass of any length, which is what makes speculative output plain decoding's.
//
// A decode step is bound by the weight stream, so the canonical block rows are read in place, every weight
// byte once per call, 16 bytes per lane with ld.global.cs (streamed: it does not evict x or the KV cache from
// L2), one chunk ahead of the math. A warp holds kSlots rows side by side, kLanes lanes across each, and
// every lane kRows rows' pieces of the same columns: x, staged per chunk of kCols inputs in shared memory as
// fp32 for all T tokens by the whole block, is read once per kRows rows, and each converted weight serves all
// T tokens.
// The block's scale (and min) leave the inner loop: sum_i (d q_i + m) x_i = d sum_i q_i x_i + m sum_i x_i,
// with sum_i x_i per (token, block) added up once while staging.
#pragma once

#include <cstdint>

#include "blocks.cuh"
#include "common.cuh"
#include "launchers.h"

namespace decodescope {
namespace gemv {

using blocks::Format;
using blocks::kBlock;
using blocks::unpack;

constexpr int kThreads = 128;

template <Format F, int kT>
struct Shape {
  static constexpr int kColsPerLane = blocks::kPerLoad<F>;  // one fetch of weights: 16 bytes (dense 32)
  static constexpr int kCols = 512;                          // x chunk; fixed: it sets each output's order
  static constexpr int kBuffers = kT <= 8 ? 2 : 1;           // x staged: kBuffers x kT x kCols fp32 <= 32 KB
  static constexpr int kLanes = kCols / kColsPerLane;
  static constexpr int kSlots = 32 / kLanes;
  static constexpr int kRows = F == Format::int8 ? 4 : 2;  // 16 weights per row in 16 bytes, q4 32, dense 16 in 32
  static constexpr int kRowsPerBlock = kThreads / 32 * kSlots * kRows;
  static constexpr int kChunkBlocks = kCols / kBlock;
  // Blocks per SM that registers must allow: one step's weights in flight is 64 B (int8, dense) or 32 B (q4) per
  // thread, so a decode step (kT = 1) wants 4 blocks (>= 16 KB per SM) resident.
  static constexpr int kMinBlocks = kT == 1 ? 4 : 2;
  static_assert(kLanes >= 8 && kLanes <= 32, "a row's lanes stay within a warp");
};

// Shared-memory slot of column c of a staged chunk: within each 32-column group the 16-byte quads are
// XOR-swizzled by the group, so the 8 lanes of one 16-byte load phase (16 or 32 columns apart) hit 8
// different bank quads.
__device__ __forceinline__ int swizzle(int c) { return (c & ~31) | ((((c >> 2) & 7) ^ ((c >> 5) & 7)) << 2) | (c & 3); }

template <typename T, Format F, int kT>
__global__ void __launch_bounds__(kThreads, (Shape<F, kT>::kMinBlocks)) gemv_kernel(const GemvArgs<T> a) {
  using S = Shape<F, kT>;
  constexpr int kCols = S::kCols, kLanes = S::kLanes, kSlots = S::kSlots, kRows = S::kRows;
  constexpr int kPerLane = S::kColsPerLane;
  constexpr int kBuffers = S::kBuffers;
  __shared__ __align__(16) float xs[kBuffers][kT][kCols];
  __shared__ float xsums[kBuffers][kT][S::kChunkBlocks];

  const int in_pad = blocks::padded<F>(a.in_features), nb = ceil_div(in_pad, kBlock);
  const int64_t row_bytes = blocks::row_bytes<F>(in_pad);
  const int lane = threadIdx.x % 32, lx = lane % kLanes;
  const int row0 = blockIdx.x * S::kRowsPerBlock + threadIdx.x / 32 * kSlots * kRows + lane / kLanes;
  const unsigned char* qs = static_cast<const unsigned char*>(a.qs);

  using Fetch = blocks::Fetch<F>;
  Fetch w[kRows];  // the next chunk's weights, in flight while this one computes
  float d[kRows], m[kRows];
  const bool w_vectors = reinterpret_cast<uintptr_t>(qs) % 16 == 0 && row_bytes % 16 == 0;
  auto fetch = [&](int chunk) {
    const int col = chunk * kCols + lx * kPerLane;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = row0 + i * kSlots;
      const bool live = row < a.out_features && col < in_pad;
      if constexpr (blocks::kDense<F>) {  // no scales: the weights are the values
        const auto* w_row = reinterpret_cast<const uint16_t*>(qs + row * row_bytes);
        w[i] = live ? blocks::load_dense<F>(w_row, col, in_pad, w_vectors) : Fetch{};
        d[i] = m[i] = 0.f;
      } else {
        w[i] = live ? Fetch{load_stream16(qs + row * row_bytes + (F == Format::int8 ? col : col / 2))} : Fetch{};
        d[i] = live ? to_float(a.d[static_cast<int64_t>(row) * nb + col / kBlock]) : 0.f;
        m[i] = F == Format::q4 && live ? to_float(a.m[static_cast<int64_t>(row) * nb + col / kBlock]) : 0.f;
      }
    }
  };
  // Item (token, 8 inputs): read as 16-byte vectors where x's rows allow, converted to fp32 (zeros past `in`
  // and past T: q4 padding has w = m) and stored; the 4 items of a block add up its sum_i x_i with 2 shuffles.
  // Items per chunk are a multiple of 32, so every lane of a warp takes part in them.
  constexpr int kV = kVec16<T>, kItems = kT * kCols / 8;
  static_assert(kItems % 32 == 0, "whole warps stage x");
  const bool x_vectors = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % kV == 0;
  auto stage = [&](int chunk, int buf) {
    for (int item = threadIdx.x; item < kItems; item += kThreads) {
      const int t = item / (kCols / 8), col = item % (kCols / 8) * 8, x_col = chunk * kCols + col;
      const T* src = a.x + t * a.x_stride + x_col;
      float v[8];
      if (x_vectors && t < a.tokens && x_col + 8 <= a.in_features) {
#pragma unroll
        for (int h = 0; h < 8; h += kV) {
          const Vec<T, kV> xv = load_vec<T, kV>(src + h);
#pragma unroll
          for (int e = 0; e < kV; ++e) v[h + e] = to_float(xv.v[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = t < a.tokens && x_col + e < a.in_features ? to_float(src[e]) : 0.f;
      }
      store_vec<float, 4>(&xs[buf][t][swizzle(col)], {{v[0], v[1], v[2], v[3]}});
      store_vec<float, 4>(&xs[buf][t][swizzle(col + 4)], {{v[4], v[5], v[6], v[7]}});
      if constexpr (F == Format::q4) {
        float sum = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) sum += v[e];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (item % 4 == 0) xsums[buf][t][col / kBlock] = sum;
      }
    }
  };

  float acc[kRows][kT];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[i][t] = 0.f;
  }

  const int n_chunks = ceil_div(in_pad, kCols);
  fetch(0);
  stage(0, 0);
  __syncthreads();
  for (int c = 0; c < n_chunks; ++c) {
    Fetch wc[kRows];
    float dc[kRows], mc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      wc[i] = w[i];
      dc[i] = d[i];
      mc[i] = m[i];
    }
    const int buf = c % kBuffers;
    if (c + 1 < n_chunks) {
      fetch(c + 1);
      if constexpr (kBuffers == 2) stage(c + 1, buf ^ 1);  // read by nobody since the barrier that ended chunk c - 1
    }
    float q[kRows][kPerLane];
#pragma unroll
    for (int i = 0; i < kRows; ++i) unpack<F>(wc[i], q[i]);
    const int col = lx * kPerLane;  // within the chunk
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      float xv[kPerLane];
#pragma unroll
      for (int e = 0; e < kPerLane; e += 4) {
        const Vec<float, 4> v = load_vec<float, 4>(&xs[buf][t][swizzle(col + e)]);
#pragma unroll
        for (int k = 0; k < 4; ++k) xv[e + k] = v.v[k];
      }
      const float xsum = F == Format::q4 ? xsums[buf][t][col / kBlock] : 0.f;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) s += q[i][e] * xv[e];
        if constexpr (blocks::kDense<F>) {
          acc[i][t] += s;
        } else {
          acc[i][t] += dc[i] * s;
        }
        if constexpr (F == Format::q4) acc[i][t] += mc[i] * xsum;
      }
    }
    __syncthreads();  // chunk c's x is read; the next iteration stages into it
    if constexpr (kBuffers == 1) {  // 16 tokens: one buffer, staged between barriers, the weights still ahead
      if (c + 1 < n_chunks) {
        stage(c + 1, 0);
        __syncthreads();
      }
    }
  }

  // Each lane holds partial sums of its columns: add them across the row's lanes, then lane t % kLanes
  // writes token t.
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[i][t] += __shfl_xor_sync(0xffffffffu, acc[i][t], offset);
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int row = row0 + i * kSlots;
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (row < a.out_features && t < a.tokens && t % kLanes == lx) {
        a.out[static_cast<int64_t>(t) * a.out_features + row] = from_float<T>(acc[i][t]);
      }
    }
  }
}

constexpr int kMaxTile = 16;  // tokens per launch

template <typename T, Format F>
cudaError_t launch_tile(const GemvArgs<T>& a, cudaStream_t stream) {
  auto go = [&](auto kernel, int rows_per_block) {
    return decodescope::launch(kernel, dim3(ceil_div(a.out_features, rows_per_block)), dim3(kThreads), stream, a);
  };
  if (a.tokens <= 1) return go(gemv_kernel<T, F, 1>, Shape<F, 1>::kRowsPerBlock);
  if (a.tokens <= 2) return go(gemv_kernel<T, F, 2>, Shape<F, 2>::kRowsPerBlock);
  if (a.tokens <= 4) return go(gemv_kernel<T, F, 4>, Shape<F, 4>::kRowsPerBlock);
  if (a.tokens <= 8) return go(gemv_kernel<T, F, 8>, Shape<F, 8>::kRowsPerBlock);
  return go(gemv_kernel<T, F, kMaxTile>, Shape<F, kMaxTile>::kRowsPerBlock);
}

template <typename T, Format F>
cudaError_t launch(const GemvArgs<T>& a, cudaStream_t stream) {
  if (a.tokens == 0 || a.out_features == 0) return cudaSuccess;
  if (a.tokens < 0 || a.in_features <= 0 || a.out_features < 0) return cudaErrorInvalidValue;
  if (!aligned16(a.qs)) return cudaErrorMisalignedAddress;  // rows are whole 16-byte multiples
  for (int t0 = 0; t0 < a.tokens; t0 += kMaxTile) {  // each tile streams the weights again: tiles are for T = 17
    GemvArgs<T> tile = a;
    tile.x = a.x + t0 * a.x_stride;
    tile.out = a.out + static_cast<int64_t>(t0) * a.out_features;
    tile.tokens = a.tokens - t0 < kMaxTile ? a.tokens - t0 : kMaxTile;
    if (const cudaError_t err = launch_tile<T, F>(tile, stream); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace gemv

template <typename T>
cudaError_t launch_linear_int8(const GemvArgs<T>& args, cudaStream_t stream) {
  return gemv::launch<T, gemv::Format::int8>(args, stream);
}

template <typename T>
cudaError_t launch_linear_q4(const GemvArgs<T>& args, cudaStream_t stream) {
  return gemv::launch<T, gemv::Format::q4>(args, stream);
}

template <typename T>
cudaError_t launch_linear_fp16(const GemvArgs<T>& args, cudaStream_t stream) {
  return gemv::launch<T, gemv::Format::fp16>(args, stream);
}

template <typename T>
cudaError_t launch_linear_bf16(const GemvArgs<T>& args, cudaStream_t stream) {
  return gemv::launch<T, gemv::Format::bf16>(args, stream);
}

}  // namespace decodescope
