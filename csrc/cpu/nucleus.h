// A sampled pick's distribution under top-k / top-p, one row at a time: engine/ops/ref.py softmax's mask
// (mask_logits) without sorting the row. Torch-free.
//
// The kept tokens are a prefix of the row in descending order, ties by index (a stable sort): top-k keeps every
// token at or above the k-th value; top-p keeps each token while the mass before it, e^(y - max) / total summed
// in that order in doubles, is below top_p. Only the tokens near the top are ever sorted: those within d of the
// max (y = x / temperature), d the least found whose tokens hold the top k, or a mass reaching top_p by a vector
// pass's estimate, which the walk itself checks. A 49,152-token row's mask took ~700 us in torch's ops (each one
// over the whole row); here a few vector passes over the row and a sort of a few to a few hundred tokens: ~40 us.
//
// A row's passes run span by span and fold the spans in order, whatever thread ran which span: a row alone uses
// every thread and a verify pass's row gets a decode step's bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "isa.h"

namespace decodescope::cpu {
namespace {

struct Candidate {
  float y;
  int32_t i;
};

// Scratch reused from row to row: the terms e^(y - max), the candidates and their indices, and each span's part of
// a pass over the row.
struct NucleusScratch {
  std::vector<float> e;
  std::vector<Candidate> c;
  std::vector<int32_t> at;
  std::vector<float> part;
  std::vector<double> sum;
  std::vector<int64_t> count;
};

// The candidates' floor: every token within d of the max (past d = 1024, where e^-d is 0 in doubles: every token).
inline float floor_at(float m, float d) { return d > 1024.f ? -INFINITY : m - d; }

// out = the row's sampling distribution: softmax(y) over the kept tokens, 0 elsewhere (y = x / tau); false, and out
// unspecified, when y holds an inf or a NaN. top_k in [0, n] (0 or n: off); top_p in (0, 1] (1: off); one of them
// on (without either, softmax is the row's distribution).
//
// Each pass over the row runs in spans of `span` values, through each(spans, fn), which calls fn(t) once for every
// span t in any order or on any thread (a row alone splits them across the threads), and the spans' parts are
// folded in order: the row's bits are the same however they were run.
template <class Each>
bool nucleus_row(const float* x, int n, int span, float tau, int64_t top_k, double top_p, float* out,
                 NucleusScratch& s, const Each& each) {
  const KernelTable& k = kernels();
  const int spans = (n + span - 1) / span;
  auto len = [&](int t) { return n - t * span < span ? n - t * span : span; };
  s.part.resize(spans), s.sum.resize(spans), s.count.resize(spans);
  each(spans, [&](int t) { s.part[t] = k.scale_max(x + t * span, len(t), tau, out + t * span); });  // out: y
  float m = -INFINITY;
  for (int t = 0; t < spans; ++t) {
    if (std::isnan(s.part[t])) return false;
    m = s.part[t] > m ? s.part[t] : m;
  }
  const bool by_k = top_k > 0 && top_k < n;
  double total = 0.0;  // the terms' sum: every token's for top-p (under top-k, the kept ones', below)
  const float* e = nullptr;
  if (!by_k) {
    s.e.resize(n);
    e = s.e.data();
    each(spans, [&](int t) { s.sum[t] = k.exp_total(out + t * span, len(t), m, s.e.data() + t * span); });
    for (int t = 0; t < spans; ++t) total += s.sum[t];
  }
  // The least d (doubling from 1, then bisected while the tokens within it are many) whose tokens hold the top k,
  // or a mass reaching top_p by the passes' estimate; each try is one vector pass over the row.
  int64_t count = 0;
  auto holds = [&](float d, int64_t& c) {
    const float floor = floor_at(m, d);
    each(spans, [&](int t) {
      s.count[t] = k.above(out + t * span, e ? e + t * span : nullptr, len(t), floor, &s.part[t]);
    });
    float mass = 0.f;
    c = 0;
    for (int t = 0; t < spans; ++t) c += s.count[t], mass += s.part[t];
    return c == n || (by_k ? c >= top_k : mass >= top_p * total);
  };
  float lo = 0.f, hi = 1.f;
  while (!holds(hi, count)) lo = hi, hi *= 2.f;
  for (int i = 0; i < 8 && count > 256; ++i) {
    int64_t c = 0;
    const float mid = 0.5f * (lo + hi);
    if (holds(mid, c)) hi = mid, count = c;
    else lo = mid;
  }
  std::vector<Candidate>& c = s.c;
  s.at.resize(n);
  size_t keep = 0;
  for (;; hi *= 2.f) {
    const float floor = floor_at(m, hi);
    each(spans, [&](int t) { s.count[t] = k.collect(out + t * span, len(t), floor, s.at.data() + t * span); });
    c.clear();
    for (int t = 0; t < spans; ++t)
      for (int64_t j = 0; j < s.count[t]; ++j) {
        const int32_t i = t * span + s.at[t * span + j];
        c.push_back({out[i], i});
      }
    std::sort(c.begin(), c.end(),
              [](const Candidate& a, const Candidate& b) { return a.y > b.y || (a.y == b.y && a.i < b.i); });
    keep = c.size();
    if (by_k) {
      const float kth = c[top_k - 1].y;  // every token at kth is kept: the twin masks those below it
      keep = top_k;
      while (keep < c.size() && c[keep].y >= kth) ++keep;
      total = 0.0;
      for (size_t j = 0; j < keep; ++j) total += std::exp(c[j].y - m);
    }
    if (top_p < 1) {
      size_t kept = 0;
      double before = 0.0;
      for (size_t j = 0; j < keep; ++j) {
        const double p = (by_k ? std::exp(c[j].y - m) : e[c[j].i]) / total;
        before += p;  // the twin's cumsum - p: the same doubles in the same order
        kept += before - p < top_p;
      }
      // the estimate fell short: the cut may lie past the candidates
      if (!by_k && kept == keep && static_cast<int64_t>(keep) < n) continue;
      keep = kept;
    }
    break;
  }
  // softmax over the kept tokens, in doubles (the max is c[0], always kept)
  double sum = 0.0;
  for (size_t j = 0; j < keep; ++j) sum += std::exp(static_cast<double>(c[j].y) - m);
  each(spans, [&](int t) { std::fill(out + t * span, out + t * span + len(t), 0.f); });
  for (size_t j = 0; j < keep; ++j)
    out[c[j].i] = static_cast<float>(std::exp(static_cast<double>(c[j].y) - m) / sum);
  return true;
}

}  // namespace
}  // namespace decodescope::cpu
