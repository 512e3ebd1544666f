// Input checks shared by the CPU torch-facing host files; messages name the offending values. The ones the
// CUDA host code shares are in ../tensor_checks.h (csrc/cuda/checks.h adds the CUDA-only ones).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../tensor_checks.h"  // check_dense, check_dtype, check_dense_heads, checked_int

namespace decodescope::cpu {

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got device ", t.device());
}

// A float32 CPU tensor [..., hidden], hidden > 0, dense.
inline void check_fp32_rows(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) > 0, name, " must be [..., hidden] with hidden > 0, got ", t.sizes());
  check_dtype(t, name, at::kFloat);
  check_dense(t, name);
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

// A KV cache's K and V: float32 or float16 (attention.h widens fp16 as it reads), the same for both. `where`
// prefixes the message ("layer 3: " in a block plan).
inline void check_kv_dtypes(const at::Tensor& k, const at::Tensor& v, const std::string& where = "") {
  TORCH_CHECK(k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf, where,
              "k_cache must be float32 or float16, got ", k.scalar_type());
  check_dtype(v, "v_cache", k.scalar_type());
}

// The bytes from a tensor's first element to just past its last (non-negative strides).
inline int64_t span_bytes(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * static_cast<int64_t>(t.element_size());
}

// Whether two tensors' memory overlaps (an output must not alias an input it reads after writing).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + span_bytes(b) && b0 < a0 + span_bytes(a);
}

}  // namespace decodescope::cpu
