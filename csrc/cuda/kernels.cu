// Every kernel, instantiated for every dtype: the one translation unit nvcc compiles for the extension
// (and, torch-free, on its own in tests/test_ext.py). ops.cpp calls these through launchers.h.
#include "activation.cuh"
#include "decode_attention.cuh"
#include "dequantize.cuh"
#include "gemv.cuh"
#include "launchers.h"
#include "norm.cuh"
#include "rope.cuh"

namespace decodescope {

#define DECODESCOPE_INSTANTIATE(T)                                                                        \
  template cudaError_t launch_rmsnorm<T>(T*, const T*, const T*, int64_t, int, float, cudaStream_t);      \
  template cudaError_t launch_add_rmsnorm<T>(T*, T*, const T*, int64_t, int, float, cudaStream_t);        \
  template cudaError_t launch_rope<T, int32_t>(T*, T*, const float*, const float*, const int32_t*,        \
                                               int64_t, int, int, int, int64_t, int64_t, int64_t,         \
                                               cudaStream_t);                                             \
  template cudaError_t launch_rope<T, int64_t>(T*, T*, const float*, const float*, const int64_t*,        \
                                               int64_t, int, int, int, int64_t, int64_t, int64_t,         \
                                               cudaStream_t);                                             \
  template cudaError_t launch_silu_mul<T>(T*, const T*, int64_t, int, cudaStream_t);                      \
  template cudaError_t launch_decode_attention<T>(const DecodeAttentionArgs<T>&, cudaStream_t);           \
  template cudaError_t plan_decode_attention<T>(int, int, int, int, int, DecodeAttentionPlan*);           \
  template cudaError_t launch_linear_int8<T>(const GemvArgs<T>&, cudaStream_t);                           \
  template cudaError_t launch_linear_q4<T>(const GemvArgs<T>&, cudaStream_t);                             \
  template cudaError_t launch_linear_fp16<T>(const GemvArgs<T>&, cudaStream_t);                           \
  template cudaError_t launch_linear_bf16<T>(const GemvArgs<T>&, cudaStream_t);                           \
  template cudaError_t launch_dequantize_int8<T>(const DequantizeArgs<T>&, cudaStream_t);                 \
  template cudaError_t launch_dequantize_q4<T>(const DequantizeArgs<T>&, cudaStream_t);

DECODESCOPE_INSTANTIATE(float)
DECODESCOPE_INSTANTIATE(__half)
DECODESCOPE_INSTANTIATE(__nv_bfloat16)

#undef DECODESCOPE_INSTANTIATE

}  // namespace decodescope
