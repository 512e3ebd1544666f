// The launchers of csrc/cuda/*.cuh built for the CPU runtime in cuda_on_cpu.h, behind a C ABI for ctypes
// (tests/test_kernels_cuda.py); dtype codes as in emulated_abi.h. Each call returns a cudaError_t;
// emu_last_error() says what went wrong inside a kernel.
#include "../activation.cuh"
#include "../decode_attention.cuh"
#include "../norm.cuh"
#include "../rope.cuh"
#include "emulated_abi.h"

extern "C" {

int emu_rmsnorm(int dtype, void* out, const void* x, const void* weight, int64_t rows, int hidden, float eps) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    return decodescope::launch_rmsnorm<T>(static_cast<T*>(out), static_cast<const T*>(x),
                                          static_cast<const T*>(weight), rows, hidden, eps, nullptr);
  });
}

int emu_add_rmsnorm(int dtype, void* x, void* residual, const void* weight, int64_t rows, int hidden, float eps) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    return decodescope::launch_add_rmsnorm<T>(static_cast<T*>(x), static_cast<T*>(residual),
                                              static_cast<const T*>(weight), rows, hidden, eps, nullptr);
  });
}

int emu_rope(int dtype, int position_bytes, void* q, void* k, const float* cos, const float* sin,
             const void* positions, int64_t tokens, int n_heads, int n_kv_heads, int head_dim,
             int64_t q_token_stride, int64_t k_token_stride, int64_t max_pos) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    if (position_bytes == 4) {
      return decodescope::launch_rope<T, int32_t>(static_cast<T*>(q), static_cast<T*>(k), cos, sin,
                                                  static_cast<const int32_t*>(positions), tokens, n_heads,
                                                  n_kv_heads, head_dim, q_token_stride, k_token_stride, max_pos,
                                                  nullptr);
    }
    return decodescope::launch_rope<T, int64_t>(static_cast<T*>(q), static_cast<T*>(k), cos, sin,
                                                static_cast<const int64_t*>(positions), tokens, n_heads,
                                                n_kv_heads, head_dim, q_token_stride, k_token_stride, max_pos,
                                                nullptr);
  });
}

int emu_silu_mul(int dtype, void* out, const void* gate_up, int64_t rows, int inter) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    return decodescope::launch_silu_mul<T>(static_cast<T*>(out), static_cast<const T*>(gate_up), rows, inter,
                                           nullptr);
  });
}

// ints: batch, tokens, n_heads, n_kv_heads, head_dim, max_len, window, sinks, splits, groups;
// strides: q_b, q_t, q_h, kv_b, kv_h, kv_s.
int emu_decode_attention(int dtype, void* out, const void* q, const void* k_cache, const void* v_cache,
                         const int* seq_lens, float* partials, int* counters, const int* ints, const int64_t* strides,
                         float scale) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    decodescope::DecodeAttentionArgs<T> a{};
    a.out = static_cast<T*>(out);
    a.q = static_cast<const T*>(q);
    a.k_cache = static_cast<const T*>(k_cache);
    a.v_cache = static_cast<const T*>(v_cache);
    a.seq_lens = seq_lens;
    a.partials = partials;
    a.counters = counters;
    a.batch = ints[0];
    a.tokens = ints[1];
    a.n_heads = ints[2];
    a.n_kv_heads = ints[3];
    a.head_dim = ints[4];
    a.max_len = ints[5];
    a.window = ints[6];
    a.sinks = ints[7];
    a.splits = ints[8];
    a.groups = ints[9];
    a.q_stride_b = strides[0];
    a.q_stride_t = strides[1];
    a.q_stride_h = strides[2];
    a.kv_stride_b = strides[3];
    a.kv_stride_h = strides[4];
    a.kv_stride_s = strides[5];
    a.scale = scale;
    return decodescope::launch_decode_attention<T>(a, nullptr);
  });
}

// plan: out {splits, groups, blocks_per_sm} for sm_count emulated SMs, each holding cuda_on_cpu::blocks_per_sm blocks.
int emu_decode_attention_plan(int dtype, int batch, int n_heads, int n_kv_heads, int head_dim, int sm_count,
                              int* plan) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    decodescope::DecodeAttentionPlan p{};
    const cudaError_t err =
        decodescope::plan_decode_attention<T>(batch, n_heads, n_kv_heads, head_dim, sm_count, &p);
    plan[0] = p.splits;
    plan[1] = p.groups;
    plan[2] = p.blocks_per_sm;
    return static_cast<int>(err);
  });
}

}  // extern "C"
