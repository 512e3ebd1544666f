// Input checks and dtype dispatch shared by the torch-facing host files (ops.cpp, ops_attention.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "../tensor_checks.h"  // check_dense, check_dtype, check_dense_heads, checked_int

namespace decodescope {

// Calls fn with a value of the CUDA element type matching dtype.
template <typename Fn>
inline void dispatch_float(at::ScalarType dtype, const char* name, Fn&& fn) {
  switch (dtype) {
    case at::ScalarType::Float: fn(float{}); break;
    case at::ScalarType::Half: fn(__half{}); break;
    case at::ScalarType::BFloat16: fn(__nv_bfloat16{}); break;
    default: TORCH_CHECK(false, name, " must be float32, float16 or bfloat16, got ", dtype);
  }
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

inline void check_cuda(const at::Tensor& t, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == ref.device(), name, " is on ", t.device(), " but the inputs are on ", ref.device());
}

inline void check_same(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name) {
  TORCH_CHECK(t.sizes() == ref.sizes(), name, " must have the shape of ", ref_name, " ", ref.sizes(), ", got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have the dtype of ", ref_name, " (",
              ref.scalar_type(), "), got ", t.scalar_type());
}

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " kernel launch failed: ", cudaGetErrorString(err));
}

// Rows of a dense [..., hidden] tensor, as the grid's x dimension takes them.
inline int64_t rows_of(const at::Tensor& x, int hidden) { return checked_int(x.numel() / hidden, "rows"); }

// x: [..., hidden] dense, weight: [hidden] of x's dtype on x's device.
inline void check_norm(const at::Tensor& x, const at::Tensor& weight, const char* x_name) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, x_name, " must be [..., hidden] with hidden > 0, got ", x.sizes());
  check_dense(x, x_name);
  check_cuda(weight, "weight", x);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must be [hidden] = [", x.size(-1),
              "], got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight must have ", x_name, "'s dtype ",
              x.scalar_type(), ", got ", weight.scalar_type());
  check_dense(weight, "weight");
}

}  // namespace decodescope
