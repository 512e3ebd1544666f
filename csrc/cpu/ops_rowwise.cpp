// Torch-facing host code for the row-wise ops (kernels in rowwise.h).
#include <ATen/record_function.h>

#include <cmath>
#include <utility>
#include <vector>

#include "checks.h"
#include "greedy.h"
#include "isa.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

// Rows per thread chunk: a decode step's single row stays on the calling thread (a handoff costs more
// than normalizing 576 values); prefill's many rows are split.
constexpr int64_t kMinChunkElems = 16 << 10;

int64_t min_rows(int64_t row_elems) { return (kMinChunkElems + row_elems - 1) / (row_elems > 0 ? row_elems : 1); }

void check_fp32_rows(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) > 0, name, " must be [..., hidden] with hidden > 0, got ", t.sizes());
  check_dtype(t, name, at::kFloat);
  check_dense(t, name);
}

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

void check_exp_rows(const at::Tensor& x) {
  check_fp32_rows(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [R, V], got ", x.sizes());
  checked_int(x.size(1), "V");
}

// A row pass's work items: each of `rows` rows of n values in `spans` spans of `span` values. With fewer rows than
// threads (a pick's one row), each row is split in spans, one a thread; a span's length is rounded up to 16 values,
// so the spans may be fewer than the threads, none of them empty.
struct Spans {
  int64_t rows;
  int n, span, spans;

  Spans(int64_t rows_, int n_) : rows(rows_), n(n_) {
    const int threads = at::get_num_threads();
    const int asked = rows < threads && n >= kMinChunkElems ? threads : 1;
    span = ((n + asked - 1) / asked + 15) / 16 * 16;
    spans = (n + span - 1) / span;
  }

  // fn(t, c0, c1) for every item t = r * spans + k, span k of row r covering [c0, c1), across the threads
  template <class Fn>
  void run(Fn fn) const {
    parallel_chunks(rows * spans, spans > 1 ? 1 : min_rows(n), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const auto [c0, c1] = range(t);
        fn(t, c0, c1);
      }
    });
  }

  std::pair<int64_t, int64_t> range(int64_t t) const {
    const int64_t c0 = (t % spans) * span;
    return {c0, c0 + span < n ? c0 + span : n};
  }
};

// The first pass of logsumexp and softmax over x [R, V]: each span's max m and s = sum e^(c (v - m)) through the
// kernel's exp_span (with out, the terms too); fold(r) gives the row's max and sum.
struct ExpPass : Spans {
  float c;
  std::vector<float> m, s;  // [rows * spans]

  ExpPass(const at::Tensor& x, float c_, float* out)
      : Spans(x.size(0), static_cast<int>(x.size(1))), c(c_), m(rows * spans), s(rows * spans) {
    const float* v = x.data_ptr<float>();
    run([&](int64_t t, int64_t c0, int64_t c1) {
      const int64_t o = (t / spans) * n + c0;
      kernels().exp_span(v + o, static_cast<int>(c1 - c0), c, out ? out + o : nullptr, &m[t], &s[t]);
    });
  }

  struct Fold {
    float max;     // the row's max (+inf, -inf when every value is)
    double total;  // sum e^(c (v - max)) over the row, when max is finite
    bool nan;      // the row holds a NaN
  };
  Fold fold(int64_t r) const {
    Fold f{-INFINITY, 0.0, false};
    for (int k = 0; k < spans; ++k) {
      f.max = m[r * spans + k] > f.max ? m[r * spans + k] : f.max;
      f.nan = f.nan || std::isnan(s[r * spans + k]);
    }
    if (!f.nan && std::isfinite(f.max))
      for (int k = 0; k < spans; ++k)
        f.total += s[r * spans + k] * std::exp(static_cast<double>(c) * (m[r * spans + k] - f.max));
    return f;
  }
};

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

void logsumexp(at::Tensor& out, const at::Tensor& x) {
  RECORD_FUNCTION("decodescope::logsumexp", std::vector<c10::IValue>({x}));
  check_exp_rows(x);
  check_cpu(out, "out");
  TORCH_CHECK(out.dim() == 1 && out.size(0) == x.size(0), "out must be [R] = [", x.size(0), "], got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  const ExpPass sp(x, 1.f, nullptr);
  float* y = out.data_ptr<float>();
  for (int64_t r = 0; r < sp.rows; ++r) {
    const ExpPass::Fold f = sp.fold(r);
    y[r] = f.nan ? NAN : std::isinf(f.max) ? f.max : f.max + static_cast<float>(std::log(f.total));
  }
}

std::vector<GreedyPick> greedy(const at::Tensor& x) {
  RECORD_FUNCTION("decodescope::greedy", std::vector<c10::IValue>({x}));
  check_exp_rows(x);
  const int64_t rows = x.size(0), n = x.size(1), units = greedy_units(n);
  const float* v = x.data_ptr<float>();
  std::vector<GreedyUnit> u(rows * units);
  parallel_chunks(rows * units, kMinChunkElems / kGreedyUnit, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) u[t] = greedy_unit(v + (t / units) * n, n, t % units);
  });
  return greedy_folds(u, v, n, rows, n);
}

void softmax(at::Tensor& out, const at::Tensor& x, double temperature) {
  RECORD_FUNCTION("decodescope::softmax", std::vector<c10::IValue>({x}));
  check_exp_rows(x);
  check_cpu(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape ", x.sizes(), ", got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature) && std::isfinite(static_cast<float>(1.0 / temperature)),
              "temperature must be a finite number > 0 whose inverse is a finite float, got ", temperature);
  float* y = out.data_ptr<float>();
  const ExpPass sp(x, static_cast<float>(1.0 / temperature), y);
  // each span's terms were e^(c (v - its own max)): one factor per span puts them over the row's max and sum
  std::vector<float> factor(sp.m.size());
  for (int64_t r = 0; r < sp.rows; ++r) {
    const ExpPass::Fold f = sp.fold(r);
    for (int k = 0; k < sp.spans; ++k) {
      const int64_t t = r * sp.spans + k;
      // NaN, +inf or a row of -inf: torch's softmax gives NaN for the whole row
      factor[t] = f.nan || std::isinf(f.max) ? NAN
                  : static_cast<float>(std::exp(static_cast<double>(sp.c) * (sp.m[t] - f.max)) / f.total);
    }
  }
  sp.run([&](int64_t t, int64_t c0, int64_t c1) {
    float* row = y + (t / sp.spans) * sp.n;
    for (int64_t i = c0; i < c1; ++i) row[i] *= factor[t];
  });
}

void race(at::Tensor& out, const at::Tensor& weights, const std::vector<int64_t>& keys) {
  RECORD_FUNCTION("decodescope::race", std::vector<c10::IValue>({weights}));
  check_exp_rows(weights);
  const int64_t rows = weights.size(0);
  TORCH_CHECK(static_cast<int64_t>(keys.size()) == rows, "keys must be ", rows, " (one a weights row), got ",
              keys.size());
  for (int64_t r = 0; r < rows; ++r)
    TORCH_CHECK(keys[r] >= 0, "keys[", r, "] must be >= 0 (engine/sampling.py position_key), got ", keys[r]);
  check_tensor(out, "out", at::kLong, "[R]", {rows});
  const Spans sp(rows, static_cast<int>(weights.size(1)));
  std::vector<float> best(rows * sp.spans);
  std::vector<int64_t> where(rows * sp.spans);
  const float* w = weights.data_ptr<float>();
  sp.run([&](int64_t t, int64_t c0, int64_t c1) {
    const int64_t r = t / sp.spans;
    const auto key = static_cast<uint64_t>(keys[r]);
    cpu::race_keyed(static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32), w + r * sp.n, c0, c1, &best[t],
                    &where[t]);
  });
  int64_t* y = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {  // the spans in order: the first NaN, else the first of the largest
    int64_t won = -1;
    float top = 0.f;
    for (int k = 0; k < sp.spans; ++k) {
      const int64_t t = r * sp.spans + k;
      if (std::isnan(best[t])) {
        won = where[t];
        break;
      }
      if (won < 0 || best[t] > top) top = best[t], won = where[t];
    }
    y[r] = won;
  }
}

void exp_noise(at::Tensor& out, int64_t key) {
  RECORD_FUNCTION("decodescope::exp_noise", std::vector<c10::IValue>({out}));
  check_cpu(out, "out");
  TORCH_CHECK(out.dim() == 1, "out must be [V], got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  checked_int(out.size(0), "V");
  TORCH_CHECK(key >= 0, "key must be >= 0 (engine/sampling.py position_key), got ", key);
  const auto k = static_cast<uint64_t>(key);
  float* y = out.data_ptr<float>();
  parallel_chunks(out.size(0), kMinChunkElems, [&](int64_t i0, int64_t i1) {
    cpu::exp_noise(static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32), y + i0, i0, i1);
  });
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
