// Torch-facing host code for a token's pick over logits rows (kernels in rowwise.h, greedy.h, nucleus.h, noise.h):
// logsumexp, greedy, softmax, the top-k / top-p distribution, the race and its noise.
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "checks.h"
#include "greedy.h"
#include "isa.h"
#include "nucleus.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

void check_exp_rows(const at::Tensor& x) {
  check_fp32_rows(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [R, V], got ", x.sizes());
  checked_int(x.size(1), "V");
}

// softmax's and nucleus's: logits x [R, V], out of x's shape, and a temperature whose inverse is a finite float.
void check_distribution_args(const at::Tensor& out, const at::Tensor& x, double temperature) {
  check_exp_rows(x);
  check_cpu(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes(), "out must have x's shape ", x.sizes(), ", got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  TORCH_CHECK(temperature > 0 && std::isfinite(temperature) && std::isfinite(static_cast<float>(1.0 / temperature)),
              "temperature must be a finite number > 0 whose inverse is a finite float, got ", temperature);
}

// A row pass's work items: each of `rows` rows of n values in spans of kSpan values (the last one shorter), split
// across the threads. The spans, and so the order a row's sums fold in, depend on n alone: a verify pass's row
// gets a decode step's bits whatever the rows beside it or the thread count (a split by the thread count when a
// row was alone gave one row and the same row in a batch of six softmaxes an ulp apart).
constexpr int kSpan = 8192;

struct Spans {
  int64_t rows;
  int n, span = kSpan, spans;

  Spans(int64_t rows_, int n_) : rows(rows_), n(n_), spans((n_ + kSpan - 1) / kSpan) {}

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

}  // namespace

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
  check_distribution_args(out, x, temperature);
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

bool nucleus(at::Tensor& out, const at::Tensor& x, double temperature, int64_t top_k, double top_p) {
  RECORD_FUNCTION("decodescope::nucleus", std::vector<c10::IValue>({x}));
  check_distribution_args(out, x, temperature);
  TORCH_CHECK(top_k >= 0, "top_k must be >= 0 (0: off), got ", top_k);
  TORCH_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1] (1: off), got ", top_p);
  const int64_t rows = x.size(0);
  const int n = static_cast<int>(x.size(1));
  TORCH_CHECK((top_k > 0 && top_k < n) || top_p < 1, "nothing to mask: top_k = ", top_k, " (off at 0 or >= V = ",
              n, ") and top_p = 1; softmax is the distribution then");
  const float* v = x.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const auto tau = static_cast<float>(temperature);
  std::vector<char> finite(rows);
  if (rows < at::get_num_threads()) {  // a pick's row: its spans across the threads
    thread_local NucleusScratch scratch;
    const auto across = [](int spans, const auto& fn) {
      parallel_chunks(spans, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) fn(static_cast<int>(t));
      });
    };
    for (int64_t r = 0; r < rows; ++r)
      finite[r] = nucleus_row(v + r * n, n, kSpan, tau, top_k, top_p, y + r * n, scratch, across);
  } else {  // a verify pass's rows: each on one thread
    parallel_chunks(rows, 1, [&](int64_t r0, int64_t r1) {
      thread_local NucleusScratch scratch;
      const auto here = [](int spans, const auto& fn) {
        for (int t = 0; t < spans; ++t) fn(t);
      };
      for (int64_t r = r0; r < r1; ++r)
        finite[r] = nucleus_row(v + r * n, n, kSpan, tau, top_k, top_p, y + r * n, scratch, here);
    });
  }
  return std::all_of(finite.begin(), finite.end(), [](char f) { return f != 0; });
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

}  // namespace decodescope::cpu
