// Attention of T new queries per row over a static KV cache, flash-decoding on CPU threads; over a SIMD
// vocabulary S, torch-free. The recipe of engine/ops/ref.py attention: query t of row b sits at position
// p = seq_lens[b] - T + t and attends keys j <= p, with a window only j < sinks or j > p - window.
//
// At batch 1 there are only Hkv (3 for the default model) (row, kv head) pairs, too few to keep two
// cores busy, and a long cache takes one core's bandwidth for the whole step. So each row's live keys are
// cut into `splits` contiguous shares; a work item (b, kv head, split) runs the kv head's whole GQA group
// (n_rep heads x T queries) over its share, so each K/V row is read from memory once for all of them,
// and leaves unnormalised partials (running max m, sum of exp l, acc = sum p v). The merge folds the
// splits with log-sum-exp. Only live keys are read: [0, len), or with a window the sinks and the window.
#pragma once

#include <cmath>

#include "kernels.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct Attention {
  using F = typename S::F;
  static constexpr int kKeys = 32;      // keys per block: one online-softmax rescale per block
  static constexpr int kQueries = 16;   // queries per tile; the tile's state lives on the stack
  static constexpr int kMaxDim = 256;   // head_dim limit of the stack buffers (the host checks)
  static constexpr float kNegInf = -INFINITY;

  // The live keys of row b as at most two ranges: [0, a_end) then [b_start, b_end).
  struct Live {
    int a_end, b_start, b_end;
    int count() const { return a_end + (b_end - b_start); }
    int position(int f) const { return f < a_end ? f : b_start + (f - a_end); }
  };

  static Live live_keys(const AttentionArgs& a, int len) {
    if (a.window <= 0) return {len, len, len};
    const int sink_end = a.sinks < len ? a.sinks : len;
    const int first_query = len - a.tokens;
    int start = first_query - a.window + 1;  // keys before this are outside every query's window
    if (start < sink_end) start = sink_end;
    return {sink_end, start, len};
  }

  static bool valid(const AttentionArgs& a, int j, int p) {
    return j <= p && (a.window <= 0 || j < a.sinks || j > p - a.window);
  }

  static F load_d(const float* p, int left) { return left >= 16 ? S::load(p) : S::load_n(p, left); }
  static void store_d(float* p, F v, int left) {
    if (left >= 16) S::store(p, v);
    else S::store_n(p, v, left);
  }

  // scores[k] = q . key[k] for n keys (n <= 16) at rows k0, k0 + 1, ...; lanes >= n hold garbage.
  static F dot16(const float* q, const float* key, int64_t ld, int n, int dim) {
    F part[16];
    for (int k = 0; k < 16; ++k) part[k] = S::zero();
    for (int i = 0; i < dim; i += 16) {
      const F qv = load_d(q + i, dim - i);
      for (int k = 0; k < n; ++k) part[k] = S::fma(qv, load_d(key + k * ld + i, dim - i), part[k]);
    }
    return S::hsum16(part);
  }

  // One (b, kv head, split): a tile of queries at a time, over the split's keys in blocks.
  static void run(const AttentionArgs& a, int64_t item0, int64_t item1) {
    const int D = a.head_dim, T = a.tokens, n_rep = a.n_heads / a.n_kv_heads, Q = n_rep * T;
    for (int64_t item = item0; item < item1; ++item) {
      const int split = static_cast<int>(item % a.splits);
      const int kvh = static_cast<int>(item / a.splits % a.n_kv_heads);
      const int b = static_cast<int>(item / a.splits / a.n_kv_heads);
      const int len = a.seq_lens[b];
      const Live live = live_keys(a, len);
      const int64_t n_live = live.count();
      const int f0 = static_cast<int>(n_live * split / a.splits), f1 = static_cast<int>(n_live * (split + 1) / a.splits);
      const float* kbase = a.k + b * a.kv_b + kvh * a.kv_h;
      const float* vbase = a.v + b * a.kv_b + kvh * a.kv_h;
      const int64_t part = (static_cast<int64_t>(b) * a.n_kv_heads + kvh) * a.splits + split;
      for (int q0 = 0; q0 < Q; q0 += kQueries) {
        const int nq = Q - q0 < kQueries ? Q - q0 : kQueries;
        alignas(64) float qs[kQueries][kMaxDim], acc[kQueries][kMaxDim], scores[kQueries][kKeys];
        float m[kQueries], l[kQueries];
        int pos[kQueries];
        for (int i = 0; i < nq; ++i) {  // query qi = g * T + t, pre-scaled so scores need no multiply
          const int qi = q0 + i, g = qi / T, t = qi % T;
          const float* src = a.q + b * a.q_b + t * a.q_t + static_cast<int64_t>(kvh * n_rep + g) * D;
          for (int d = 0; d < D; d += 16) store_d(qs[i] + d, S::mul(load_d(src + d, D - d), S::set1(a.scale)), D - d);
          for (int d = 0; d < D; d += 16) store_d(acc[i] + d, S::zero(), D - d);
          m[i] = kNegInf;
          l[i] = 0.f;
          pos[i] = len - T + t;
        }
        // Walk [f0, f1) of the live keys in blocks that do not cross from the sinks into the window.
        for (int f = f0; f < f1;) {
          const int j0 = live.position(f);
          int n = f1 - f < kKeys ? f1 - f : kKeys;
          if (f < live.a_end && f + n > live.a_end) n = live.a_end - f;
          f += n;
          block(a, kbase + j0 * a.kv_s, vbase + j0 * a.kv_s, j0, n, nq, qs, acc, scores, m, l, pos);
        }
        for (int i = 0; i < nq; ++i) {
          float* pa = a.part_acc + (part * Q + q0 + i) * D;
          for (int d = 0; d < D; d += 16) store_d(pa + d, load_d(acc[i] + d, D - d), D - d);
          a.part_ml[(part * Q + q0 + i) * 2] = m[i];
          a.part_ml[(part * Q + q0 + i) * 2 + 1] = l[i];
        }
      }
    }
  }

  // Keys j0 .. j0+n-1 (n <= kKeys) against the tile's queries; online softmax per query.
  static void block(const AttentionArgs& a, const float* kp, const float* vp, int j0, int n, int nq,
                    const float (*qs)[kMaxDim], float (*acc)[kMaxDim], float (*scores)[kKeys], float* m, float* l,
                    const int* pos) {
    const int D = a.head_dim;
    for (int i = 0; i < nq; ++i) {
      const int p = pos[i];
      const bool none = j0 > p || (a.window > 0 && j0 >= a.sinks && j0 + n - 1 <= p - a.window);
      if (none) continue;
      const bool all = j0 + n - 1 <= p && (a.window <= 0 || j0 + n - 1 < a.sinks || j0 > p - a.window);
      for (int k = 0; k < n; k += 16) {
        const int cnt = n - k < 16 ? n - k : 16;
        S::store(scores[i] + k, dot16(qs[i], kp + k * a.kv_s, a.kv_s, cnt, D));
      }
      for (int k = 0; k < n; ++k)
        if (!all && !valid(a, j0 + k, p)) scores[i][k] = kNegInf;
      float bmax = kNegInf;
      for (int k = 0; k < n; ++k) bmax = scores[i][k] > bmax ? scores[i][k] : bmax;
      if (bmax == kNegInf) continue;
      const float m_new = bmax > m[i] ? bmax : m[i];
      const float rescale = std::exp(m[i] - m_new);  // 0 on the first live block (m = -inf)
      m[i] = m_new;
      F lsum = S::zero();
      for (int k = 0; k < n; k += 16) {
        const int cnt = n - k < 16 ? n - k : 16;
        F pv = S::exp(S::sub(S::load(scores[i] + k), S::set1(m_new)));
        if (cnt < 16) pv = mask_lanes(pv, cnt);
        S::store(scores[i] + k, pv);
        lsum = S::add(lsum, pv);
      }
      l[i] = l[i] * rescale + S::reduce_add(lsum);
      const F r = S::set1(rescale);
      for (int d = 0; d < D; d += 16) {
        const int left = D - d;
        F o = S::mul(load_d(acc[i] + d, left), r);
        for (int k = 0; k < n; ++k) o = S::fma(S::set1(scores[i][k]), load_d(vp + k * a.kv_s + d, left), o);
        store_d(acc[i] + d, o, left);
      }
    }
  }

  static F mask_lanes(F v, int n) {  // lanes >= n -> 0
    alignas(64) float tmp[16];
    S::store(tmp, v);
    return S::load_n(tmp, n);
  }

  // Rows (b, t, h) of out: sum over splits of e^(m_s - M) acc_s / sum of e^(m_s - M) l_s.
  static void merge(const AttentionArgs& a, int64_t row0, int64_t row1) {
    const int D = a.head_dim, T = a.tokens, H = a.n_heads, n_rep = H / a.n_kv_heads, Q = n_rep * T;
    for (int64_t row = row0; row < row1; ++row) {
      const int h = static_cast<int>(row % H), t = static_cast<int>(row / H % T), b = static_cast<int>(row / H / T);
      const int kvh = h / n_rep, qi = (h % n_rep) * T + t;
      const int64_t first = (static_cast<int64_t>(b) * a.n_kv_heads + kvh) * a.splits;
      float big = kNegInf;
      for (int s = 0; s < a.splits; ++s) {
        const float ms = a.part_ml[((first + s) * Q + qi) * 2];
        big = ms > big ? ms : big;
      }
      float denom = 0.f;
      float* o = a.out + b * a.out_b + t * a.out_t + static_cast<int64_t>(h) * D;
      for (int d = 0; d < D; d += 16) store_d(o + d, S::zero(), D - d);
      for (int s = 0; s < a.splits; ++s) {
        const float* ml = a.part_ml + ((first + s) * Q + qi) * 2;
        if (ml[0] == kNegInf) continue;  // a split with no live key for this query
        const float w = std::exp(ml[0] - big);
        denom += w * ml[1];
        const float* pa = a.part_acc + ((first + s) * Q + qi) * D;
        for (int d = 0; d < D; d += 16)
          store_d(o + d, S::fma(S::set1(w), load_d(pa + d, D - d), load_d(o + d, D - d)), D - d);
      }
      const F inv = S::set1(1.f / denom);
      for (int d = 0; d < D; d += 16) store_d(o + d, S::mul(load_d(o + d, D - d), inv), D - d);
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
