// A greedy pick's three numbers for a row of logits: the first index of its maximum (torch's argmax: a NaN counts
// as the maximum), the maximum, and log(sum(exp(v))) (the shown probability's denominator, in doubles). Torch-free.
//
// A row is read in units of kGreedyUnit values, each reduced to its max m and s = sum e^(v - m) (the kernels'
// exp_span); the units fold in order, in doubles, and the argmax is looked for in the first unit holding the
// maximum. So the numbers depend on neither the thread count nor how a pass cut the row: the standalone op
// (ops_sampling.cpp greedy) and the head's matmul reducing each unit of logits as it writes it (ops_linear.cpp
// linear_greedy) give the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "isa.h"

namespace decodescope::cpu {

// A row's pick: the first index of its maximum, the maximum, logsumexp (ops.h declares the same).
using GreedyPick = std::tuple<int64_t, double, double>;

namespace {

constexpr int kGreedyUnit = 1024;  // 64 panels of 16 outputs: a unit of logits is still in L1 when reduced

struct GreedyUnit {
  float m, s;
};

inline int64_t greedy_units(int64_t n) { return (n + kGreedyUnit - 1) / kGreedyUnit; }

// Unit j of the row v[0, n): v[j * kGreedyUnit, ...), the last one short.
inline GreedyUnit greedy_unit(const float* v, int64_t n, int64_t j) {
  const int64_t c0 = j * kGreedyUnit;
  GreedyUnit u;
  kernels().exp_span(v + c0, static_cast<int>(c0 + kGreedyUnit < n ? kGreedyUnit : n - c0), 1.f, nullptr, &u.m,
                     &u.s);
  return u;
}

// The row v[0, n) from its units (u[j] of v[j * kGreedyUnit, ...)). A NaN anywhere: (its first index, NaN, NaN); a
// +inf: (its first index, +inf, +inf); every value -inf: (0, -inf, -inf), as torch gives them.
inline GreedyPick greedy_fold(const GreedyUnit* u, int64_t n_units, const float* v, int64_t n) {
  auto first = [&](int64_t j, auto is_it) {  // the first index in unit j whose value is_it
    const int64_t i1 = (j + 1) * kGreedyUnit < n ? (j + 1) * kGreedyUnit : n;
    for (int64_t i = j * kGreedyUnit; i < i1; ++i)
      if (is_it(v[i])) return i;
    return j * kGreedyUnit;  // unreachable: the unit's own reduction saw such a value
  };
  for (int64_t j = 0; j < n_units; ++j)
    if (std::isnan(u[j].s))  // exp_span's s is NaN exactly when its span holds a NaN
      return {first(j, [](float x) { return std::isnan(x); }), NAN, NAN};
  float m = -INFINITY;
  int64_t best = 0;
  for (int64_t j = 0; j < n_units; ++j)
    if (u[j].m > m) m = u[j].m, best = j;
  double total = 0.0;
  if (std::isfinite(m))
    for (int64_t j = 0; j < n_units; ++j) total += u[j].s * std::exp(static_cast<double>(u[j].m) - m);
  return {first(best, [m](float x) { return x == m; }), m, std::isfinite(m) ? m + std::log(total) : m};
}

// Each of `rows` rows (v[r * ld, r * ld + n)) from its units, u[r * greedy_units(n) + j].
inline std::vector<GreedyPick> greedy_folds(const std::vector<GreedyUnit>& u, const float* v, int64_t ld,
                                            int64_t rows, int64_t n) {
  const int64_t units = greedy_units(n);
  std::vector<GreedyPick> picks;
  for (int64_t r = 0; r < rows; ++r) picks.push_back(greedy_fold(u.data() + r * units, units, v + r * ld, n));
  return picks;
}

}  // namespace
}  // namespace decodescope::cpu
