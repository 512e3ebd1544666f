// The contract between the kernels (csrc/cuda/*.cuh, compiled by nvcc in kernels.cu) and the torch-facing host
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

// Split-KV decode attention for T queries per row, planned on the device (decode_attention.cuh). Strides are in
// elements; the innermost dimension of q, k and v is dense.
template <typename T>
struct DecodeAttentionArgs {
  T* out;               // [batch, tokens, n_heads, head_dim], dense
  const T* q;           // [batch, tokens, n_heads, head_dim]
  const T* k_cache;     // [batch, n_kv_heads, max_len, head_dim]
  const T* v_cache;     // same shape and strides as k_cache
  const int* seq_lens;  // [batch], device memory, the tokens included: query t sits at seq_lens[b] - tokens + t
  float* partials;      // [batch * tokens, n_heads, splits + groups, head_dim + 4] workspace: per split (then per
                        // merge group) the unnormalised output, its running max (log2 units) and its sum of exp
  int* counters;        // [batch * tokens, n_heads, groups + 1], zero between launches (the last arrival resets them)
  int batch, tokens, n_heads, n_kv_heads, head_dim, max_len;
  int window, sinks;    // window 0: every key up to the query's position p; else keys j < sinks or j > p - window
  int splits, groups;   // the grid's splits per (row, kv head), and the merge groups they report to
  int64_t q_stride_b, q_stride_t, q_stride_h;
  int64_t kv_stride_b, kv_stride_h, kv_stride_s;
  float scale;
};

// head_dim 64 or 128; k/v 16-byte aligned with strides that are multiples of 16 bytes (else
// cudaErrorInvalidValue / cudaErrorMisalignedAddress, launching nothing).
template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionArgs<T>& args, cudaStream_t stream);

// The grid for one full wave on sm_count SMs at one query per row: splits per (row, kv head) from the kernel's
// occupancy (blocks_per_sm), and the merge groups (with splits, the workspace's shape). Depends on the batch and
// heads only, never on the queries per row, which is what keeps a position's bits the same at every T.
struct DecodeAttentionPlan {
  int splits, groups, blocks_per_sm;
};
template <typename T>
cudaError_t plan_decode_attention(int batch, int n_heads, int n_kv_heads, int head_dim, int sm_count,
                                  DecodeAttentionPlan* plan);

// Weight-only GEMV over GGUF blocks of 32 inputs (blocks.cuh), or dense fp16 / bf16 rows, read in place (gemv.cuh):
// out = x @ dequantize(W)^T, each output reduced in one order whatever the tokens.
template <typename T>
struct GemvArgs {
  T* out;          // [tokens, out_features], dense
  const T* x;      // [tokens, in_features], rows x_stride apart
  const void* qs;  // int8: int8 [out_features, in_pad]; q4: uint8 [out_features, in_pad / 2], two nibbles a byte;
                   // fp16 / bf16: the weight [out_features, in_features]
  const __half* d;  // [out_features, in_pad / 32] block scales; dense: unused
  const __half* m;  // q4: [out_features, in_pad / 32] block mins (w = d * q + m); int8, dense: unused
  int tokens, in_features, out_features;  // tokens: tiles of 16 launch apart; in_pad = in_features rounded to 32
  int64_t x_stride;
};

template <typename T>
cudaError_t launch_linear_int8(const GemvArgs<T>& args, cudaStream_t stream);
template <typename T>
cudaError_t launch_linear_q4(const GemvArgs<T>& args, cudaStream_t stream);
template <typename T>
cudaError_t launch_linear_fp16(const GemvArgs<T>& args, cudaStream_t stream);
template <typename T>
cudaError_t launch_linear_bf16(const GemvArgs<T>& args, cudaStream_t stream);

// The same blocks dequantized into a dense matrix (dequantize.cuh): out = dequantize(W), for the rows a GEMV's
// token tiles do not take; cuBLAS multiplies it.
template <typename T>
struct DequantizeArgs {
  T* out;           // [out_features, in_features], rows out_stride apart; the last block's padding is not written
  const void* qs;   // as GemvArgs
  const __half* d;  // as GemvArgs
  const __half* m;  // as GemvArgs
  int out_features, in_features;
  int64_t out_stride;
};

template <typename T>
cudaError_t launch_dequantize_int8(const DequantizeArgs<T>& args, cudaStream_t stream);
template <typename T>
cudaError_t launch_dequantize_q4(const DequantizeArgs<T>& args, cudaStream_t stream);

}  // namespace decodescope
