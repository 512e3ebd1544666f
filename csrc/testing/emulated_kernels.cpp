// The launchers of csrc/*.cuh built for the CPU runtime in cuda_on_cpu.h, behind a C ABI for ctypes
// (tests/test_kernels_cuda.py). dtype: 0 float32, 1 float16, 2 bfloat16. Each call returns a cudaError_t;
// emu_last_error() says what went wrong inside a kernel.
#include "../activation.cuh"
#include "../decode_attention.cuh"
#include "../norm.cuh"
#include "../rope.cuh"

namespace {

template <typename Fn>
int with_dtype(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0: return fn(float{});
    case 1: return fn(__half{});
    case 2: return fn(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

const char* emu_last_error() { return cuda_on_cpu::last_error.c_str(); }

void emu_set_schedule(int eager_copies, int reverse_order) {
  cuda_on_cpu::set_schedule(eager_copies != 0, reverse_order != 0);
}

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

// ints: batch, n_heads, n_kv_heads, head_dim, max_len, chunk, splits; strides: q_b, q_h, kv_b, kv_h, kv_s.
int emu_decode_attention(int dtype, void* out, const void* q, const void* k_cache, const void* v_cache,
                         const int* seq_lens, float* partial_acc, float* partial_ml, const int* ints,
                         const int64_t* strides, float scale) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    decodescope::DecodeAttentionArgs<T> a{};
    a.out = static_cast<T*>(out);
    a.q = static_cast<const T*>(q);
    a.k_cache = static_cast<const T*>(k_cache);
    a.v_cache = static_cast<const T*>(v_cache);
    a.seq_lens = seq_lens;
    a.partial_acc = partial_acc;
    a.partial_ml = partial_ml;
    a.batch = ints[0];
    a.n_heads = ints[1];
    a.n_kv_heads = ints[2];
    a.head_dim = ints[3];
    a.max_len = ints[4];
    a.chunk = ints[5];
    a.splits = ints[6];
    a.q_stride_b = strides[0];
    a.q_stride_h = strides[1];
    a.kv_stride_b = strides[2];
    a.kv_stride_h = strides[3];
    a.kv_stride_s = strides[4];
    a.scale = scale;
    return decodescope::launch_decode_attention<T>(a, nullptr);
  });
}

}  // extern "C"
