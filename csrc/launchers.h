// The contract between the kernels (csrc/*.cuh, compiled by nvcc in kernels.cu) and the torch-facing host
// code (ops.cpp, compiled by the host compiler). Plain C++ and the CUDA runtime API only: no torch, no
// device code. Each launcher returns the launch's cudaError_t; kernels.cu instantiates them for
// T in {float, __half, __nv_bfloat16}.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace decodescope {

// x, out: [rows, hidden]; weight: [hidden]. out may be x.
template <typename T>
cudaError_t launch_rmsnorm(T* out, const T* x, const T* weight, int64_t rows, int hidden, float eps,
                           cudaStream_t stream);

// residual += x; x = rmsnorm(residual). Both [rows, hidden], updated in place.
template <typename T>
cudaError_t launch_add_rmsnorm(T* x, T* residual, const T* weight, int64_t rows, int hidden, float eps,
                               cudaStream_t stream);

// In place on q: [tokens, n_heads, D] and k: [tokens, n_kv_heads, D]; Pos is int32_t or int64_t.
template <typename T, typename Pos>
cudaError_t launch_rope(T* q, T* k, const float* cos, const float* sin, const Pos* positions, int64_t tokens,
                        int n_heads, int n_kv_heads, int head_dim, int64_t q_token_stride,
                        int64_t k_token_stride, int64_t max_pos, cudaStream_t stream);

// gate_up: [rows, 2 * inter] -> out: [rows, inter].
template <typename T>
cudaError_t launch_silu_mul(T* out, const T* gate_up, int64_t rows, int inter, cudaStream_t stream);

// Split-KV decode attention. Strides are in elements; the innermost dimension of q, k and v is dense.
template <typename T>
struct DecodeAttentionArgs {
  T* out;               // [batch, n_heads, head_dim], dense
  const T* q;           // [batch, n_heads, head_dim]
  const T* k_cache;     // [batch, n_kv_heads, max_len, head_dim]
  const T* v_cache;     // same shape and strides as k_cache
  const int* seq_lens;  // [batch], device memory: keys j >= seq_lens[b] are never read
  float* partial_acc;   // [batch, n_heads, splits, head_dim] workspace
  float* partial_ml;    // [batch, n_heads, splits, 2] workspace: running max (log2 units), sum of exp
  int batch, n_heads, n_kv_heads, head_dim, max_len;
  int chunk;   // keys per split
  int splits;  // >= ceil(max_len / chunk): one launch serves every live length
  int64_t q_stride_b, q_stride_h;
  int64_t kv_stride_b, kv_stride_h, kv_stride_s;
  float scale;
};

// head_dim 64 or 128; k/v 16-byte aligned with strides that are multiples of 16 bytes (else
// cudaErrorInvalidValue / cudaErrorMisalignedAddress, launching nothing).
template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionArgs<T>& args, cudaStream_t stream);

}  // namespace decodescope
