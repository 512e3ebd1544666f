// silu(gate) * up for gate_up = [gate | up]: [rows, 2I] -> [rows, I], fp32 math, one rounding.
#pragma once

#include "common.cuh"

namespace decodescope {

// grid: (rows, column blocks); each thread handles N adjacent columns.
template <typename T, int N>
__global__ void silu_mul_kernel(T* __restrict__ out, const T* __restrict__ gate_up, int inter) {
  const int64_t row = blockIdx.x;
  const int col = (blockIdx.y * blockDim.x + threadIdx.x) * N;
  if (col >= inter) return;
  const T* g = gate_up + row * 2 * inter + col;
  const Vec<T, N> gv = load_vec<T, N>(g);
  const Vec<T, N> uv = load_vec<T, N>(g + inter);
  Vec<T, N> yv;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float x = to_float(gv.v[e]);
    yv.v[e] = from_float<T>(x / (1.f + expf(-x)) * to_float(uv.v[e]));
  }
  store_vec<T, N>(out + row * inter + col, yv);
}

// 16-byte loads when inter is a multiple of the vector width (then `up` starts aligned too).
template <typename T>
cudaError_t launch_silu_mul(T* out, const T* gate_up, int64_t rows, int inter, cudaStream_t stream) {
  if (rows == 0 || inter == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  constexpr int kThreads = 256;
  if (inter % V == 0 && aligned16(out) && aligned16(gate_up)) {
    const dim3 grid(static_cast<unsigned>(rows), ceil_div(inter / V, kThreads));
    return launch(silu_mul_kernel<T, V>, grid, kThreads, stream, out, gate_up, inter);
  }
  const dim3 grid(static_cast<unsigned>(rows), ceil_div(inter, kThreads));
  return launch(silu_mul_kernel<T, 1>, grid, kThreads, stream, out, gate_up, inter);
}

}  // namespace decodescope
