// Input checks on torch tensors that name the offending value, shared by the CUDA host code (checks.h) and
// the CPU host code (cpu/checks.h). Torch-only: no CUDA headers, so the CPU module builds without them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>

namespace decodescope {

inline void check_dense(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous, got strides ", t.strides(), " for shape ", t.sizes());
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

// [..., n_heads, D] with each head's D elements dense and heads D apart (the token stride is free).
inline void check_dense_heads(const at::Tensor& t, const char* name) {
  const int64_t d = t.size(-1);
  TORCH_CHECK(t.stride(-1) == 1 && t.stride(-2) == d, name, " must have dense heads (strides [*, ", d,
              ", 1]), got strides ", t.strides());
}

inline int checked_int(int64_t v, const char* name) {
  TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), name, " = ", v, " does not fit in int32");
  return static_cast<int>(v);
}

}  // namespace decodescope
