// The row-wise ops over a SIMD vocabulary S: rmsnorm (with the residual add fused in), the gated MLP
// activations silu(gate) * up and gelu_tanh(gate) * up, and rotary embedding. Recipes of engine/ops/ref.py in
// fp32; torch-free.
#pragma once

#include <cmath>

#include "kernels.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct Rowwise {
  using F = typename S::F;

  static F load(const float* p, int left) { return left >= 16 ? S::load(p) : S::load_n(p, left); }
  static void store(float* p, F v, int left) {
    if (left >= 16) S::store(p, v);
    else S::store_n(p, v, left);
  }

  // y = (x * rsqrt(mean(x^2) + eps)) * w. With a residual: residual += x first (rounded to fp32, as the
  // unfused add would), and the norm reads the sum. out may alias x: each chunk is read before written.
  static void norm(const NormArgs& a, int64_t r0, int64_t r1) {
    const int n = a.hidden;
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = a.x + r * n;
      float* res = a.residual ? a.residual + r * n : nullptr;
      F ss = S::zero();
      for (int i = 0; i < n; i += 16) {
        F v = load(x + i, n - i);
        if (res) {
          v = S::add(load(res + i, n - i), v);
          store(res + i, v, n - i);
        }
        ss = S::fma(v, v, ss);
      }
      const F inv = S::set1(1.f / std::sqrt(S::reduce_add(ss) / static_cast<float>(n) + a.eps));
      const float* src = res ? res : x;
      float* y = a.out + r * n;
      for (int i = 0; i < n; i += 16)
        store(y + i, S::mul(S::mul(load(src + i, n - i), inv), load(a.w + i, n - i)), n - i);
    }
  }

  // A span of a row for logsumexp and softmax (ops_sampling.cpp folds a row's spans): m = its max and
  // s = sum e^(c (v - m)) for c = 1 / temperature > 0, torch's recipe, so nothing overflows; with `out`, also
  // out[i] = e^(c (v_i - m)), the span's unnormalized softmax. e^x by S::exp_le0 (its argument is <= 0). The sum runs
  // in 16 lanes over 4096 values at a time, each stretch folded into a double (~1e-7 relative at 262,144 values).
  // A span holding inf or NaN takes the scalar path, in doubles: s = NaN for a NaN, m = +inf for a +inf (s = 1),
  // m = -inf and s = 0 when every value is -inf, and a -inf among finite values counts as e^-inf = 0 (a top-k or
  // top-p mask's tokens: exactly 0 in out).
  static void exp_span_special(const float* v, int n, float c, float* out, float* m_out, float* s_out) {
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) {
      if (std::isnan(v[i])) {
        *m_out = NAN, *s_out = NAN;
        for (int j = 0; out && j < n; ++j) out[j] = NAN;
        return;
      }
      m = v[i] > m ? v[i] : m;
    }
    double s = 0.0;
    if (!std::isfinite(m) && out)  // every value -inf: terms of 0; a +inf: NaN (torch's softmax row)
      for (int i = 0; i < n; ++i) out[i] = m < 0 ? 0.f : NAN;
    if (std::isfinite(m))
      for (int i = 0; i < n; ++i) {
        const double e = v[i] == -INFINITY ? 0.0 : std::exp(static_cast<double>(c) * (static_cast<double>(v[i]) - m));
        s += e;
        if (out) out[i] = static_cast<float>(e);
      }
    *m_out = m, *s_out = std::isinf(m) ? (m > 0 ? 1.f : 0.f) : static_cast<float>(s);
  }

  static void exp_span(const float* v, int n, float c, float* out, float* m_out, float* s_out) {
    constexpr int kStretch = 4096;
    const int body = n - n % 16;
    F mv = S::set1(-INFINITY), bad = S::zero();  // bad: the values times 0 summed, NaN once an inf or NaN went by
    for (int i = 0; i < body; i += 16) {
      const F a = S::load(v + i);
      mv = S::max(mv, a);
      bad = S::fma(a, S::zero(), bad);
    }
    float m = body ? S::reduce_max(mv) : -INFINITY, tail_bad = 0.f;
    for (int i = body; i < n; ++i) {
      m = v[i] > m ? v[i] : m;
      tail_bad += v[i] * 0.f;
    }
    if (S::nonfinite(bad, bad) != 0.f || tail_bad != 0.f || !std::isfinite(m))  // NaN != 0
      return exp_span_special(v, n, c, out, m_out, s_out);
    const F M = S::set1(m), C = S::set1(c);
    auto term = [&](int i) { return S::exp_le0(S::mul(S::sub(S::load(v + i), M), C)); };
    double s = 0.0;
    for (int i0 = 0; i0 < body; i0 += kStretch) {
      const int i1 = body - i0 < kStretch ? body : i0 + kStretch;
      F a = S::zero(), b = S::zero();  // two chains, so two exps overlap
      int i = i0;
      for (; i + 32 <= i1; i += 32) {
        const F ea = term(i), eb = term(i + 16);
        if (out) S::store(out + i, ea), S::store(out + i + 16, eb);
        a = S::add(a, ea);
        b = S::add(b, eb);
      }
      if (i < i1) {
        const F ea = term(i);
        if (out) S::store(out + i, ea);
        a = S::add(a, ea);
      }
      s += static_cast<double>(S::reduce_add(S::add(a, b)));
    }
    for (int i = body; i < n; ++i) {
      const double e = std::exp(static_cast<double>(c) * (static_cast<double>(v[i]) - m));
      s += e;
      if (out) out[i] = static_cast<float>(e);
    }
    *m_out = m, *s_out = static_cast<float>(s);
  }

  // A sampled pick's passes under top-k / top-p (nucleus.h, run by ops_sampling.cpp nucleus). scale_max: y = x / tau,
  // the twin's float division, and y's max; NaN when y holds an inf or a NaN (the host then takes the twin).
  static float scale_max(const float* x, int n, float tau, float* y) {
    const F t = S::set1(tau);
    const int body = n - n % 16;
    F mv = S::set1(-INFINITY), bad = S::zero();
    for (int i = 0; i < body; i += 16) {
      const F v = S::div(S::load(x + i), t);
      S::store(y + i, v);
      mv = S::max(mv, v);
      bad = S::fma(v, S::zero(), bad);
    }
    float m = body ? S::reduce_max(mv) : -INFINITY, tail_bad = 0.f;
    for (int i = body; i < n; ++i) {
      y[i] = x[i] / tau;
      m = y[i] > m ? y[i] : m;
      tail_bad += y[i] * 0.f;
    }
    return S::nonfinite(bad, bad) != 0.f || tail_bad != 0.f ? NAN : m;  // NaN != 0
  }

  // e[i] = e^(y[i] - m) (exp_le0: m is the max) and their sum in doubles, in a fixed order: 16 running sums,
  // folded pairwise.
  static double exp_total(const float* y, int n, float m, float* e) {
    const F M = S::set1(m);
    double acc[16] = {};
    for (int i = 0; i < n; i += 16) {
      const int lanes = n - i < 16 ? n - i : 16;
      store(e + i, S::exp_le0(S::sub(load(y + i, lanes), M)), lanes);  // lanes past n: computed, not stored
      for (int j = 0; j < lanes; ++j) acc[j] += e[i + j];
    }
    for (int w = 8; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    return acc[0];
  }

  // How many y[i] >= floor, and with e the sum of their e[i] (in 16 float lanes: a search's estimate).
  static int64_t above(const float* y, const float* e, int n, float floor, float* mass) {
    const F f = S::set1(floor), one = S::set1(1.f);
    const int body = n - n % 16;
    F count = S::zero(), sum = S::zero();  // a lane's count is exact below 2^24
    for (int i = 0; i < body; i += 16) {
      const F v = S::load(y + i);
      count = S::add(count, S::keep_ge(v, f, one));
      if (e) sum = S::add(sum, S::keep_ge(v, f, S::load(e + i)));
    }
    auto total = static_cast<int64_t>(S::reduce_add(count));
    float m = S::reduce_add(sum);
    for (int i = body; i < n; ++i)
      if (y[i] >= floor) ++total, m += e ? e[i] : 0.f;
    *mass = m;
    return total;
  }

  // The indices of y[i] >= floor, in order, into at; returns how many.
  static int collect(const float* y, int n, float floor, int32_t* at) {
    const F f = S::set1(floor);
    const int body = n - n % 16;
    int c = 0;
    for (int i = 0; i < body; i += 16)
      for (unsigned bits = S::ge_bits(S::load(y + i), f); bits; bits &= bits - 1) at[c++] = i + __builtin_ctz(bits);
    for (int i = body; i < n; ++i)
      if (y[i] >= floor) at[c++] = i;
    return c;
  }

  // Both gates are g * sigmoid(z(g)) = g / (1 + e^-z): silu has z = g; gelu's tanh form,
  // 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3), is the same with z = 2u, which keeps tanh's
  // cancellation near 0 out of it. `neg_z` gives -z.
  template <class NegZ>
  static void gated(float* out, const float* gate_up, int inter, int64_t r0, int64_t r1, NegZ neg_z) {
    const F one = S::set1(1.f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = gate_up + r * 2 * inter;
      float* y = out + r * inter;
      for (int i = 0; i < inter; i += 16) {
        const F gv = load(g + i, inter - i), uv = load(g + inter + i, inter - i);
        const F e = S::exp(neg_z(gv));
        store(y + i, S::mul(S::div(gv, S::add(one, e)), uv), inter - i);
      }
    }
  }

  static void silu_mul(float* out, const float* gate_up, int inter, int64_t r0, int64_t r1) {
    gated(out, gate_up, inter, r0, r1, [](F g) { return S::sub(S::zero(), g); });
  }

  static void gelu_tanh_mul(float* out, const float* gate_up, int inter, int64_t r0, int64_t r1) {
    const F c = S::set1(-2.f * 0.7978845608028654f), c3 = S::set1(0.044715f);  // -2 sqrt(2/pi)
    gated(out, gate_up, inter, r0, r1, [&](F g) { return S::mul(c, S::fma(S::mul(c3, g), S::mul(g, g), g)); });
  }

  // HF half rotation: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) over the two halves of each head.
  static void rope(const RopeArgs& a, int64_t t0, int64_t t1) {
    const int half = a.head_dim / 2;
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = a.cos + a.pos[t] * half;
      const float* s = a.sin + a.pos[t] * half;
      for (int h = 0; h < a.n_heads + a.n_kv_heads; ++h) {
        float* row = h < a.n_heads ? a.q + t * a.q_stride + h * a.head_dim
                                   : a.k + t * a.k_stride + (h - a.n_heads) * a.head_dim;
        for (int i = 0; i < half; i += 16) {
          const F x1 = load(row + i, half - i), x2 = load(row + half + i, half - i);
          const F cv = load(c + i, half - i), sv = load(s + i, half - i);
          store(row + i, S::fnma(x2, sv, S::mul(x1, cv)), half - i);
          store(row + half + i, S::fma(x1, sv, S::mul(x2, cv)), half - i);
        }
      }
    }
  }
};

}  // namespace
}  // namespace decodescope::cpu
