// Rotary embedding in place on q and k, HF llama's half-rotation layout, at positions read from device
// memory (so a captured graph serves every step). One block per token; a thread owns a (x[i], x[i + D/2])
// pair, reads both before writing both, so in-place is safe without barriers.
#pragma once

#include "common.cuh"

namespace decodescope {

// q: [tokens, n_heads, D], k: [tokens, n_kv_heads, D], rows `*_token_stride` elements apart, heads dense.
// cos, sin: [max_pos, D/2] fp32. A position outside [0, max_pos) leaves its token unrotated rather than
// reading past the table; the engine sizes the table for its cache, so that never happens in practice.
template <typename T, typename Pos>
__global__ void rope_kernel(T* q, T* k, const float* cos, const float* sin, const Pos* positions,
                            int n_heads, int n_kv_heads, int head_dim, int64_t q_token_stride,
                            int64_t k_token_stride, int64_t max_pos) {
  const int64_t token = blockIdx.x;
  const int64_t pos = static_cast<int64_t>(positions[token]);
  if (pos < 0 || pos >= max_pos) return;
  const int half = head_dim / 2;
  const float* c_row = cos + pos * half;
  const float* s_row = sin + pos * half;
  const int pairs = (n_heads + n_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half, i = p % half;
    T* row = head < n_heads ? q + token * q_token_stride + static_cast<int64_t>(head) * head_dim
                            : k + token * k_token_stride + static_cast<int64_t>(head - n_heads) * head_dim;
    const float x1 = to_float(row[i]), x2 = to_float(row[i + half]);
    const float c = c_row[i], s = s_row[i];
    row[i] = from_float<T>(x1 * c - x2 * s);
    row[i + half] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T, typename Pos>
cudaError_t launch_rope(T* q, T* k, const float* cos, const float* sin, const Pos* positions, int64_t tokens,
                        int n_heads, int n_kv_heads, int head_dim, int64_t q_token_stride,
                        int64_t k_token_stride, int64_t max_pos, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const int pairs = (n_heads + n_kv_heads) * (head_dim / 2);
  const int threads = row_threads(pairs) > 256 ? 256 : row_threads(pairs);
  return launch(rope_kernel<T, Pos>, static_cast<unsigned>(tokens), threads, stream, q, k, cos, sin, positions,
                n_heads, n_kv_heads, head_dim, q_token_stride, k_token_stride, max_pos);
}

}  // namespace decodescope
