// Input checks shared by the CPU torch-facing host files; messages name the offending values. (The CUDA
// host code has its own in csrc/checks.h, which pulls in the CUDA runtime headers.)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace decodescope::cpu {

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got device ", t.device());
}

inline void check_dtype(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

inline void check_dense(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous, got strides ", t.strides(), " for shape ", t.sizes());
}

// A CPU tensor of the dtype, contiguous, of exactly `shape` (`what` spells the letters, e.g. "[P, in, 16]").
inline void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, const char* what,
                         const std::vector<int64_t>& shape) {
  check_cpu(t, name);
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), name, " must be ", what, " = ", at::IntArrayRef(shape),
              ", got ", t.sizes());
  check_dtype(t, name, dtype);
  check_dense(t, name);
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

// Whether two tensors' memory overlaps (an output must not alias an input it reads after writing).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace decodescope::cpu
