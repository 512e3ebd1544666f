// int8 (GGUF Q8_0) and q4 (GGUF Q4_1) weights dequantized into a dense [out, in] matrix of the activations'
// dtype: the route for more rows than the GEMV's token tiles take (a prefill, full-sequence logits, a long verify
// pass or catch-up), where cuBLAS then multiplies on tensor cores. It moves a write and a read of the dense weight
// (4 bytes a weight in bf16) on top of the blocks (0.625 for q4, 1.0625 for int8): fewer bytes than a GEMV pass per
// 16 rows would read past about 120 rows (q4) or 80 (int8), more below that, where bench/gemv.py's 17- and 64-row
// figures say what it costs.
//
// One thread per 16-byte load of a row (16 int8 or 32 q4 inputs, one block's scale and min), the weight's rows
// read in place as gemv.cuh reads them. The recipe is the twin's (engine/weights: q * d, then + m, each rounded in
// fp32, then one rounding to T), so the result is bit for bit weights.dequantize(blocks).to(T).
#pragma once

#include <cstdint>

#include "blocks.cuh"
#include "common.cuh"
#include "launchers.h"

namespace decodescope {
namespace dequantize {

using blocks::Format;
using blocks::kBlock;

constexpr int kThreads = 128;

template <typename T, Format F>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeArgs<T> a) {
  constexpr int kPer = blocks::kPerLoad<F>, kV = kVec16<T>;
  const int nb = ceil_div(a.in_features, kBlock), loads = nb * kBlock / kPer;  // 16-byte loads per row
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= static_cast<int64_t>(a.out_features) * loads) return;
  const int64_t row = i / loads;
  const int col = static_cast<int>(i % loads) * kPer;
  const unsigned char* qs = static_cast<const unsigned char*>(a.qs);
  const Vec<uint32_t, 4> w = load_stream16(qs + row * blocks::row_bytes<F>(nb * kBlock) + (F == Format::int8 ? col : col / 2));
  float q[kPer];
  blocks::unpack<F>(w, q);
  const int64_t scale = row * nb + col / kBlock;
  const float d = to_float(a.d[scale]);
  const float m = F == Format::q4 ? to_float(a.m[scale]) : 0.f;
  T v[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    // no FMA: the twin rounds the product, then the sum
    v[e] = from_float<T>(F == Format::q4 ? __fadd_rn(__fmul_rn(q[e], d), m) : __fmul_rn(q[e], d));
  }
  T* dst = a.out + row * a.out_stride + col;
  if (col + kPer <= a.in_features && a.out_stride % kV == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0) {
#pragma unroll
    for (int e = 0; e < kPer; e += kV) {
      Vec<T, kV> out;
#pragma unroll
      for (int k = 0; k < kV; ++k) out.v[k] = v[e + k];
      store_vec<T, kV>(dst + e, out);
    }
  } else {  // the row's last inputs, past which the padding of the last block is not written
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      if (col + e < a.in_features) dst[e] = v[e];
    }
  }
}

template <typename T, Format F>
cudaError_t launch(const DequantizeArgs<T>& a, cudaStream_t stream) {
  if (a.out_features < 0 || a.in_features <= 0 || a.out_stride < a.in_features) return cudaErrorInvalidValue;
  if (a.out_features == 0) return cudaSuccess;
  if (!aligned16(a.qs)) return cudaErrorMisalignedAddress;  // rows are whole 16-byte multiples
  const int64_t loads = static_cast<int64_t>(a.out_features) * (ceil_div(a.in_features, kBlock) * kBlock /
                                                                  blocks::kPerLoad<F>);
  const int64_t grid = (loads + kThreads - 1) / kThreads;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  return decodescope::launch(dequantize_kernel<T, F>, dim3(static_cast<unsigned>(grid)), dim3(kThreads), stream, a);
}

}  // namespace dequantize

template <typename T>
cudaError_t launch_dequantize_int8(const DequantizeArgs<T>& args, cudaStream_t stream) {
  return dequantize::launch<T, dequantize::Format::int8>(args, stream);
}

template <typename T>
cudaError_t launch_dequantize_q4(const DequantizeArgs<T>& args, cudaStream_t stream) {
  return dequantize::launch<T, dequantize::Format::q4>(args, stream);
}

}  // namespace decodescope
