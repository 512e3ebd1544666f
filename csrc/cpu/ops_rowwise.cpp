// Torch-facing host code for the row-wise ops of a forward (kernels in rowwise.h); a pick's are in ops_sampling.cpp.
#include <ATen/record_function.h>

#include <vector>

#include "checks.h"
#include "isa.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

void check_norm_weight(const at::Tensor& weight, const at::Tensor& x) {
  check_cpu(weight, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must be [hidden] = [", x.size(-1),
              "], got ", weight.sizes());
  check_dtype(weight, "weight", at::kFloat);
  check_dense(weight, "weight");
}

void run_norm(const NormArgs& a, int64_t rows) {
  parallel_chunks(rows, min_rows(a.hidden), [&](int64_t r0, int64_t r1) { kernels().norm(a, r0, r1); });
}

void run_gated(at::Tensor& out, const at::Tensor& gate_up, SiluMulFn fn) {
  check_fp32_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "gate_up must be [..., 2I], got ", gate_up.sizes());
  auto expected = gate_up.sizes().vec();
  expected.back() /= 2;
  check_cpu(out, "out");
  TORCH_CHECK(out.sizes() == at::IntArrayRef(expected), "out must be [..., I] = ", at::IntArrayRef(expected),
              ", got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  const int inter = checked_int(expected.back(), "I");
  const int64_t rows = gate_up.numel() / (2 * inter);
  float* y = out.data_ptr<float>();
  const float* g = gate_up.data_ptr<float>();
  parallel_chunks(rows, min_rows(3 * inter), [&](int64_t r0, int64_t r1) { fn(y, g, inter, r0, r1); });
}

}  // namespace

void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  RECORD_FUNCTION("decodescope::rmsnorm", std::vector<c10::IValue>({x}));
  check_fp32_rows(x, "x");
  check_norm_weight(weight, x);
  check_fp32_rows(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape ", x.sizes(), ", got ", out.sizes());
  const int hidden = checked_int(x.size(-1), "hidden");
  run_norm({out.data_ptr<float>(), x.data_ptr<float>(), nullptr, weight.data_ptr<float>(), hidden,
            static_cast<float>(eps)},
           x.numel() / hidden);
}

void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  RECORD_FUNCTION("decodescope::add_rmsnorm", std::vector<c10::IValue>({x, residual}));
  check_fp32_rows(x, "x");
  check_norm_weight(weight, x);
  check_fp32_rows(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes(), "residual must have x's shape ", x.sizes(), ", got ", residual.sizes());
  const int hidden = checked_int(x.size(-1), "hidden");
  run_norm({x.data_ptr<float>(), x.data_ptr<float>(), residual.data_ptr<float>(), weight.data_ptr<float>(), hidden,
            static_cast<float>(eps)},
           x.numel() / hidden);
}

void silu_mul(at::Tensor& out, const at::Tensor& gate_up) {
  RECORD_FUNCTION("decodescope::silu_mul", std::vector<c10::IValue>({gate_up}));
  run_gated(out, gate_up, kernels().silu_mul);
}

void gelu_tanh_mul(at::Tensor& out, const at::Tensor& gate_up) {
  RECORD_FUNCTION("decodescope::gelu_tanh_mul", std::vector<c10::IValue>({gate_up}));
  run_gated(out, gate_up, kernels().gelu_tanh_mul);
}

void rmsnorm_heads(at::Tensor& x, const at::Tensor& weight, double eps) {
  RECORD_FUNCTION("decodescope::rmsnorm_heads", std::vector<c10::IValue>({x}));
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 3 && x.size(2) > 0, "x must be [N, H, D] with D > 0, got ", x.sizes());
  check_dtype(x, "x", at::kFloat);
  check_dense_heads(x, "x");
  check_norm_weight(weight, x);
  const int64_t n = x.size(0), heads = x.size(1), stride = x.stride(0);
  const int d = checked_int(x.size(2), "D");
  float* base = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  // each token's heads are `heads` dense rows of D: the norm kernel over them, in place
  parallel_chunks(n, min_rows(heads * d), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* row = base + t * stride;
      kernels().norm({row, row, nullptr, w, d, static_cast<float>(eps)}, 0, heads);
    }
  });
}

void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions) {
  RECORD_FUNCTION("decodescope::rope", std::vector<c10::IValue>({q, k, positions}));
  check_cpu(q, "q");
  check_cpu(k, "k");
  TORCH_CHECK(q.dim() == 3, "q must be [N, H, D], got ", q.sizes());
  TORCH_CHECK(k.dim() == 3, "k must be [N, Hkv, D], got ", k.sizes());
  const int64_t n = q.size(0), d = q.size(2);
  TORCH_CHECK(k.size(0) == n && k.size(2) == d, "k must be [N, Hkv, D] = [", n, ", Hkv, ", d, "], got ", k.sizes());
  TORCH_CHECK(d > 0 && d % 2 == 0, "head_dim must be even, got D = ", d);
  check_dtype(q, "q", at::kFloat);
  check_dtype(k, "k", at::kFloat);
  check_dense_heads(q, "q");
  check_dense_heads(k, "k");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == d / 2, "cos must be [max_pos, D/2] = [max_pos, ", d / 2, "], got ",
              cos.sizes());
  check_tensor(cos, "cos", at::kFloat, "[max_pos, D/2]", {cos.size(0), d / 2});
  check_tensor(sin, "sin", at::kFloat, "[max_pos, D/2]", {cos.size(0), d / 2});
  check_cpu(positions, "positions");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == n, "positions must be [N] = [", n, "], got ",
              positions.sizes());
  TORCH_CHECK(positions.scalar_type() == at::kInt || positions.scalar_type() == at::kLong,
              "positions must be int32 or int64, got ", positions.scalar_type());
  check_dense(positions, "positions");
  // Positions are host memory here, so a bad one fails loudly instead of reading past the table.
  std::vector<int64_t> pos(n);
  for (int64_t t = 0; t < n; ++t) {
    pos[t] = positions.scalar_type() == at::kInt ? positions.data_ptr<int32_t>()[t] : positions.data_ptr<int64_t>()[t];
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "positions[", t, "] = ", pos[t], " is outside the table [0, ",
                cos.size(0), ")");
  }
  const RopeArgs a{q.data_ptr<float>(), k.data_ptr<float>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                   pos.data(), checked_int(q.size(1), "H"), checked_int(k.size(1), "Hkv"), static_cast<int>(d),
                   q.stride(0), k.stride(0), cos.size(0)};
  const int64_t token_elems = (q.size(1) + k.size(1)) * d;
  parallel_chunks(n, min_rows(token_elems), [&](int64_t t0, int64_t t1) { kernels().rope(a, t0, t1); });
}

}  // namespace decodescope::cpu
