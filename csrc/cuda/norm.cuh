// RMSNorm, and residual add fused with RMSNorm: one block per row of [rows, hidden].
// Recipe of engine/ops/ref.py: fp32 math, y = (x * rsqrt(mean(x^2) + eps)) * w, rounded once to T.
#pragma once

#include "common.cuh"

namespace decodescope {

// The second pass of both kernels: dst = src * inv * w, each thread over the vectors it summed.
template <typename T, int N>
__device__ __forceinline__ void scale_row(T* dst, const T* src, const T* weight, float inv, int n_vec) {
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const Vec<T, N> sv = load_vec<T, N>(src + i * N);
    const Vec<T, N> wv = load_vec<T, N>(weight + i * N);
    Vec<T, N> yv;
#pragma unroll
    for (int e = 0; e < N; ++e) yv.v[e] = from_float<T>(to_float(sv.v[e]) * inv * to_float(wv.v[e]));
    store_vec<T, N>(dst + i * N, yv);
  }
}

// out may alias x: every thread reads its own elements before it writes them.
template <typename T, int N>
__global__ void rmsnorm_kernel(T* out, const T* x, const T* weight, int hidden, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * hidden;
  T* yr = out + row * hidden;
  const int n_vec = hidden / N;

  float ss = 0.f;
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const Vec<T, N> xv = load_vec<T, N>(xr + i * N);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float f = to_float(xv.v[e]);
      ss += f * f;
    }
  }
  scale_row<T, N>(yr, xr, weight, rsqrtf(block_sum(ss) / hidden + eps), n_vec);
}

// residual += x (rounded to T, as an unfused add would), then x = rmsnorm(residual). The second pass
// rereads the residual this same thread just wrote, so no barrier is needed between the passes.
template <typename T, int N>
__global__ void add_rmsnorm_kernel(T* x, T* residual, const T* weight, int hidden, float eps) {
  const int64_t row = blockIdx.x;
  T* xr = x + row * hidden;
  T* rr = residual + row * hidden;
  const int n_vec = hidden / N;

  float ss = 0.f;
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const Vec<T, N> xv = load_vec<T, N>(xr + i * N);
    Vec<T, N> rv = load_vec<T, N>(rr + i * N);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      rv.v[e] = from_float<T>(to_float(rv.v[e]) + to_float(xv.v[e]));
      const float f = to_float(rv.v[e]);
      ss += f * f;
    }
    store_vec<T, N>(rr + i * N, rv);
  }
  scale_row<T, N>(xr, rr, weight, rsqrtf(block_sum(ss) / hidden + eps), n_vec);
}

// 16-byte loads when every row starts 16-byte aligned; hidden sizes like 111 take the scalar path.
template <typename T>
cudaError_t launch_rmsnorm(T* out, const T* x, const T* weight, int64_t rows, int hidden, float eps,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const unsigned grid = static_cast<unsigned>(rows);
  if (hidden % V == 0 && aligned16(out) && aligned16(x) && aligned16(weight)) {
    return launch(rmsnorm_kernel<T, V>, grid, row_threads(hidden / V), stream, out, x, weight, hidden, eps);
  }
  return launch(rmsnorm_kernel<T, 1>, grid, row_threads(hidden), stream, out, x, weight, hidden, eps);
}

template <typename T>
cudaError_t launch_add_rmsnorm(T* x, T* residual, const T* weight, int64_t rows, int hidden, float eps,
                               cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const unsigned grid = static_cast<unsigned>(rows);
  if (hidden % V == 0 && aligned16(x) && aligned16(residual) && aligned16(weight)) {
    return launch(add_rmsnorm_kernel<T, V>, grid, row_threads(hidden / V), stream, x, residual, weight, hidden, eps);
  }
  return launch(add_rmsnorm_kernel<T, 1>, grid, row_threads(hidden), stream, x, residual, weight, hidden, eps);
}

}  // namespace decodescope
