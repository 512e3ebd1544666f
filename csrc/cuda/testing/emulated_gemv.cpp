// The GEMV launchers of gemv.cuh and the dequantize launchers of dequantize.cuh built for the CPU runtime
// in cuda_on_cpu.h, behind a C ABI for ctypes (tests/test_gemv_cuda.py); dtype codes as in emulated_abi.h; weight
// format codes 0 int8, 1 q4, 2 fp16, 3 bf16 (d and m null where the format has none). Each call returns a cudaError_t; emu_last_error() says what went wrong inside a kernel.
#include "../dequantize.cuh"
#include "../gemv.cuh"
#include "emulated_abi.h"

extern "C" {

// The rows of csrc/format_list.h a CUDA kernel reads, as the module's format_facts() reports them: row i's name,
// bits and block (i from 0 while it returns 1).
int emu_format(int i, const char** name, double* bits, int* block) {
  constexpr int n = sizeof(decodescope::kCudaFormatFacts) / sizeof(decodescope::kCudaFormatFacts[0]);
  if (i < 0 || i >= n) return 0;
  *name = decodescope::kCudaFormatFacts[i].name;
  *bits = decodescope::kCudaFormatFacts[i].bits;
  *block = decodescope::kCudaFormatFacts[i].block;
  return 1;
}

// ints: tokens, in_features, out_features
int emu_linear(int fmt, int dtype, void* out, const void* x, const void* qs, const void* d, const void* m,
               const int* ints, int64_t x_stride) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    decodescope::GemvArgs<T> a{};
    a.out = static_cast<T*>(out);
    a.x = static_cast<const T*>(x);
    a.qs = qs;
    a.d = static_cast<const __half*>(d);
    a.m = static_cast<const __half*>(m);
    a.tokens = ints[0];
    a.in_features = ints[1];
    a.out_features = ints[2];
    a.x_stride = x_stride;
    switch (fmt) {
      case 0: return decodescope::launch_linear_int8<T>(a, nullptr);
      case 1: return decodescope::launch_linear_q4<T>(a, nullptr);
      case 2: return decodescope::launch_linear_fp16<T>(a, nullptr);
      case 3: return decodescope::launch_linear_bf16<T>(a, nullptr);
      default: return cudaErrorInvalidValue;
    }
  });
}

// ints: out_features, in_features
int emu_dequantize(int q4, int dtype, void* out, const void* qs, const void* d, const void* m, const int* ints,
                   int64_t out_stride) {
  return with_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    decodescope::DequantizeArgs<T> a{};
    a.out = static_cast<T*>(out);
    a.qs = qs;
    a.d = static_cast<const __half*>(d);
    a.m = static_cast<const __half*>(m);
    a.out_features = ints[0];
    a.in_features = ints[1];
    a.out_stride = out_stride;
    return q4 ? decodescope::launch_dequantize_q4<T>(a, nullptr) : decodescope::launch_dequantize_int8<T>(a, nullptr);
  });
}

}  // extern "C"
