// Attention of T new queries per row over a static KV cache, flash-decoding on CPU threads; over a SIMD
// vocabulary S, torch-free. The recipe of engine/ops/ref.py attention: query t of row b sits at position
// p = seq_lens[b] - T + t and attends keys j <= p, with a window only j < sinks or j > p - window.
//
// At batch 1 there are only Hkv (3 for the default model) (row, kv head) pairs, too few to keep two cores
// busy, and a long cache takes one core's bandwidth for the whole step. So each row's keys are cut into splits
// at fixed positions (kernels.h split_start); a work item (b, kv head, split) runs the kv head's whole GQA group
// (n_rep heads x T queries) over the split's live keys, so each K/V row is read from memory once for all of
// them, and leaves unnormalised partials (running max m, sum of exp l, acc = sum p v). The merge folds the
// splits with log-sum-exp. Only live keys count: [0, len), or with a window the sinks and the window; a group of 16
// keys that holds one reads its other rows too where they lie inside the cache (dot16_dense), in lanes masked to -inf.
//
// Batch invariance: splits start at fixed positions and the blocks inside them (one online-softmax rescale
// each) at multiples of kKeys, lane k of a block holding key j0 + k, so a query meets the same keys
// in the same blocks, lanes and splits whether it is a decode step's only query or one of a verify pass's T:
// the extra keys a longer pass reads are masked for it (weight exactly 0, and a masked block is skipped),
// and its output comes out the same bits. Tying the splits to the thread count or the row's length, as an
// even share per thread would, gave each T its own sum order.
//
// The cache holds fp32 or fp16 values (E = float or uint16_t, AttentionArgs::kv_f16): an fp16 value is widened to
// fp32 exactly as it is loaded, and every sum runs in fp32 in the same order either way, so only the bytes read
// change (half of them, a long context's share of a decode step).
#pragma once

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels.h"

namespace decodescope::cpu {
namespace {

template <class S>
struct Attention {
  using F = typename S::F;
  static constexpr int kKeys = 32;      // keys per block (two groups of 16): one online-softmax rescale per block
  static_assert(split_start(1) % kKeys == 0, "splits must start at block boundaries");
  // How many blocks ahead a block prefetches its rows (block()), past the split's end into the next split where
  // the thread's next item is that one. Two blocks ahead and across splits, a decode step's attention over
  // Qwen2.5-1.5B's cache at 2,048 / 4,096 positions (28 layers from DRAM, 2 threads) took 0.87x / 0.92x the
  // time of one block ahead within a split (8 alternating rounds; 0.90x / 0.91x in 6 more); one block ahead
  // across splits 0.94x / 0.96x, three 0.91x / 0.90x, two ahead with the items claimed one at a time (no next
  // item known) 1.01x / 0.98x.
  static constexpr int kAhead = 2;
  static constexpr int kQueries = 16;   // queries per tile; the tile's state lives on the stack
  static constexpr int kMaxDim = 256;   // head_dim limit of the stack buffers (the host checks)
  static constexpr float kNegInf = -INFINITY;

  // The live keys of row b as at most two ranges: [0, a_end) then [b_start, b_end).
  struct Live {
    int a_end, b_start, b_end;
    bool contains(int j) const { return j < a_end || (j >= b_start && j < b_end); }
    bool any(int j0, int j1) const { return j0 < j1 && (j0 < a_end || (j1 > b_start && j0 < b_end)); }
    bool all(int j0, int j1) const { return j1 <= a_end || (j0 >= b_start && j1 <= b_end); }
    int first(int j) const { return j < a_end || j >= b_start ? j : b_start; }  // the first live key from j on
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

  // A head is `chunks` 16-lane vectors. ND > 0: D = 16 * ND, known when compiled (64 and 128), so the loops
  // over chunks unroll and their accumulators live in registers. ND = 0: any even D, the last chunk masked.
  template <int ND>
  static int chunks(int D) { return ND > 0 ? ND : (D + 15) / 16; }
  template <int ND>
  static F ld(const float* p, int c, int D) {
    if constexpr (ND > 0) return S::load(p + 16 * c);
    else return load_d(p + 16 * c, D - 16 * c);
  }
  template <int ND>
  static void st(float* p, int c, int D, F v) {
    if constexpr (ND > 0) S::store(p + 16 * c, v);
    else store_d(p + 16 * c, v, D - 16 * c);
  }

  // Chunk c of a cached row (a key or a value) in fp32: E = float as ld<ND>, E = uint16_t (fp16) widened exactly.
  template <int ND, class E>
  static F ldkv(const E* p, int c, int D) {
    if constexpr (std::is_same_v<E, float>) {
      return ld<ND>(p, c, D);
    } else {
      if (ND > 0 || D - 16 * c >= 16) return S::load_f16(p + 16 * c);
      alignas(64) uint16_t part[16] = {};  // the last chunk of a head that is not a whole number of 16: lanes past D 0
      std::memcpy(part, p + 16 * c, sizeof(uint16_t) * (D - 16 * c));
      return S::load_f16(part);
    }
  }
  // Elements of E a cache line holds: prefetches step by it.
  template <class E>
  static constexpr int kLine = 64 / static_cast<int>(sizeof(E));

  static int group_keys(int n, int g) { return n - 16 * g < 16 ? n - 16 * g : 16; }  // keys of a block's group g

  // The rows of keys j0 .. j0 + 15 for dot16, one block's and group's for every query of the tile: keys that are
  // not live (or past n) read a live one instead (stand_in), which the caller masks. At least one is live.
  template <class E>
  static void key_rows(const Live& live, const E* kbase, int64_t stride, int j0, int n, const E** row) {
    const int stand_in = live.first(j0);
    for (int k = 0; k < 16; ++k) row[k] = kbase + (k < n && live.contains(j0 + k) ? j0 + k : stand_in) * stride;
  }

  // Lane k = q . the key at row[k].
  template <int ND, class E>
  static F dot16(const float* q, const E* const* row, int D) {
    F part[16];
    for (int k = 0; k < 16; ++k) part[k] = S::zero();
    for (int c = 0; c < chunks<ND>(D); ++c) {
      const F qv = ld<ND>(q, c, D);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) part[k] = S::fma(qv, ldkv<ND>(row[k], c, D), part[k]);
    }
    return S::hsum16(part);  // one transpose-and-add tree instead of 16 horizontal sums
  }

  // dot16 over 16 consecutive rows of a dense cache (its row stride the head size, ND > 0): each key's loads are one
  // base register and constant offsets, where dot16's 16 row pointers do not fit the registers beside the loop's own
  // and are reloaded before about half of its FMAs (a verify pass's scores were bound by those loads). The same
  // FMAs in the same order, so the same bits.
  template <int ND, class E>
  static F dot16_dense(const float* q, const E* base) {
    F part[16];
    for (int k = 0; k < 16; ++k) part[k] = S::zero();
    for (int c = 0; c < ND; ++c) {
      const F qv = S::load(q + 16 * c);
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) part[k] = S::fma(qv, ldkv<ND>(base + k * ND * 16, c, 16 * ND), part[k]);
    }
    return S::hsum16(part);
  }

  // One (b, kv head, split): a tile of queries at a time, over the split's keys in blocks.
  static void run(const AttentionArgs& a, int64_t item0, int64_t item1) {
    if (a.kv_f16) return run_as<uint16_t>(a, item0, item1);
    run_as<float>(a, item0, item1);
  }

  template <class E>
  static void run_as(const AttentionArgs& a, int64_t item0, int64_t item1) {
    if (a.head_dim == 64) return run_items<4, E>(a, item0, item1);
    if (a.head_dim == 128) return run_items<8, E>(a, item0, item1);
    run_items<0, E>(a, item0, item1);
  }

  template <int ND, class E>
  static void run_items(const AttentionArgs& a, int64_t item0, int64_t item1) {
    const int D = a.head_dim, T = a.tokens, n_rep = a.n_heads / a.n_kv_heads, Q = n_rep * T;
    for (int64_t item = item0; item < item1; ++item) {
      const int split = static_cast<int>(item % a.splits);
      const int kvh = static_cast<int>(item / a.splits % a.n_kv_heads);
      const int b = static_cast<int>(item / a.splits / a.n_kv_heads);
      const int len = a.seq_lens[b];
      const Live live = live_keys(a, len);
      const int j_lo = split_start(split), j_end = split_start(split + 1), j_hi = len < j_end ? len : j_end;
      const int64_t part = (static_cast<int64_t>(b) * a.n_kv_heads + kvh) * a.splits + split;
      if (!live.any(j_lo, j_hi)) {  // past the row, or between the sinks and the window: an empty partial
        for (int qi = 0; qi < Q; ++qi) {
          a.part_ml[(part * Q + qi) * 2] = kNegInf;
          a.part_ml[(part * Q + qi) * 2 + 1] = 0.f;
        }
        continue;
      }
      const E* kbase = static_cast<const E*>(a.k) + b * a.kv_b + kvh * a.kv_h;
      const E* vbase = static_cast<const E*>(a.v) + b * a.kv_b + kvh * a.kv_h;
      const int tiles = (Q + kQueries - 1) / kQueries, per_tile = (Q + tiles - 1) / tiles;  // 18 queries: 9 + 9
      for (int q0 = 0; q0 < Q; q0 += per_tile) {
        const int nq = Q - q0 < per_tile ? Q - q0 : per_tile;
        alignas(64) float qs[kQueries][kMaxDim], acc[kQueries][kMaxDim];
        float m[kQueries], l[kQueries];
        int pos[kQueries];
        for (int i = 0; i < nq; ++i) {  // query qi = g * T + t, pre-scaled so scores need no multiply
          const int qi = q0 + i, g = qi / T, t = qi % T;
          const float* src = a.q + b * a.q_b + t * a.q_t + static_cast<int64_t>(kvh * n_rep + g) * D;
          for (int c = 0; c < chunks<ND>(D); ++c) {
            st<ND>(qs[i], c, D, S::mul(ld<ND>(src, c, D), S::set1(a.scale)));
            st<ND>(acc[i], c, D, S::zero());
          }
          m[i] = kNegInf;
          l[i] = 0.f;
          pos[i] = len - T + t;
        }
        // the item after this one in the thread's range is the next split of the same row and head when it
        // starts where this split ends: its first block is the next one to prefetch past this split's end
        const bool runs_on = item + 1 < item1 && split + 1 < a.splits && j_hi == j_end && q0 + per_tile >= Q;
        for (int j0 = j_lo; j0 < j_hi; j0 += kKeys) {
          const int n = j_hi - j0 < kKeys ? j_hi - j0 : kKeys;
          if (!live.any(j0, j0 + n)) continue;
          const int ahead = j0 + kAhead * kKeys;
          const bool next = (ahead < j_hi || runs_on) && ahead < len && live.any(ahead, ahead + kKeys);
          block<ND, E>(a, live, kbase, vbase, j0, n, nq, qs, acc, m, l, pos, next);
        }
        for (int i = 0; i < nq; ++i) {
          float* pa = a.part_acc + (part * Q + q0 + i) * D;
          for (int c = 0; c < chunks<ND>(D); ++c) st<ND>(pa, c, D, ld<ND>(acc[i], c, D));
          a.part_ml[(part * Q + q0 + i) * 2] = m[i];
          a.part_ml[(part * Q + q0 + i) * 2 + 1] = l[i];
        }
      }
    }
  }

  // Keys j0 .. j0+n-1 (n <= kKeys, j0 a multiple of kKeys) against the tile's queries; online softmax per
  // query. Lanes whose key is not live are neither read nor counted (weight 0). With `next`, the first query
  // also prefetches the rows of the block kAhead blocks on into L2, K a group of 16 rows before each score group
  // and V a row per key, spread through the work rather than in one burst that would fill the miss queue and
  // stall: the scores read K across 16 rows at once, a pattern the hardware prefetcher follows poorly. Spread
  // like this beat prefetching all the rows at the block's start, which in turn beat no prefetch
  // (bench/kernels.py).
  template <int ND, class E>
  static void block(const AttentionArgs& a, const Live& live, const E* kbase, const E* vbase, int j0, int n,
                    int nq, const float (*qs)[kMaxDim], float (*acc)[kMaxDim], float* m, float* l, const int* pos,
                    bool next) {
    const int D = a.head_dim, groups = (n + 15) / 16;
    const bool all_live = live.all(j0, j0 + n);
    const E* kn = next ? kbase + (j0 + kAhead * kKeys) * a.kv_s : nullptr;
    const E* vn = next ? vbase + (j0 + kAhead * kKeys) * a.kv_s : nullptr;
    // A group reads its 16 rows straight from a dense cache where all 16 lie inside it: the lanes of keys that are
    // not live (or past the row) are masked below whatever they read, as with the stand-ins.
    bool dense[2];
    const E* rows[2][16];
    for (int g = 0; g < groups; ++g) {
      dense[g] = ND > 0 && a.kv_s == D && j0 + 16 * g + 16 <= a.max_len;
      if (!dense[g] && live.any(j0 + 16 * g, j0 + 16 * g + group_keys(n, g)))
        key_rows(live, kbase, a.kv_s, j0 + 16 * g, group_keys(n, g), rows[g]);
    }
    // Three passes over the tile's queries, each query's own work in the same order as one query alone: scores,
    // then the online softmax, then the values. A query's chain (scores, max, exp, sum, the weighted rows) is
    // serial; written query after query the core could not start the next one's before this one's ended.
    alignas(64) float p[kQueries][kKeys];
    float rescale[kQueries];
    bool skip[kQueries];
    for (int i = 0; i < nq; ++i) {
      const int last = pos[i];  // the query's position: keys j <= last
      skip[i] = j0 > last || (a.window > 0 && j0 >= a.sinks && j0 + n - 1 <= last - a.window);
      if (skip[i]) continue;
      const bool all = all_live && j0 + n - 1 <= last &&
                       (a.window <= 0 || j0 + n - 1 < a.sinks || j0 > last - a.window);
      for (int g = 0; g < groups; ++g) {
        const int cnt = group_keys(n, g);
        if (kn)
          for (int k = 16 * g; k < 16 * g + 16; ++k)
            for (int d = 0; d < D; d += kLine<E>) __builtin_prefetch(kn + k * a.kv_s + d, 0, 2);
        if (!live.any(j0 + 16 * g, j0 + 16 * g + cnt))
          S::store(p[i] + 16 * g, S::set1(kNegInf));
        else if (dense[g])
          S::store(p[i] + 16 * g, dot16_dense<ND, E>(qs[i], kbase + (j0 + 16 * g) * a.kv_s));
        else
          S::store(p[i] + 16 * g, dot16<ND, E>(qs[i], rows[g], D));
      }
      kn = nullptr;  // the first query to get here prefetched the next block's keys
      for (int k = n; k < 16 * groups; ++k) p[i][k] = kNegInf;  // past the block: weight 0
      if (!all)
        for (int k = 0; k < n; ++k)
          if (!live.contains(j0 + k) || !valid(a, j0 + k, last)) p[i][k] = kNegInf;
    }
    for (int i = 0; i < nq; ++i) {
      if (skip[i]) continue;
      F mx = S::load(p[i]);
      if (groups == 2) mx = S::max(mx, S::load(p[i] + 16));
      const float bmax = S::reduce_max(mx);
      if (bmax == kNegInf) {
        skip[i] = true;
        continue;
      }
      const float m_new = bmax > m[i] ? bmax : m[i];
      rescale[i] = std::exp(m[i] - m_new);  // 0 on the first live block (m = -inf)
      m[i] = m_new;
      F lsum = S::zero();
      for (int g = 0; g < groups; ++g) {
        const F e = S::exp(S::sub(S::load(p[i] + 16 * g), S::set1(m_new)));  // exp(-inf) = 0
        S::store(p[i] + 16 * g, e);
        lsum = S::add(lsum, e);
      }
      l[i] = l[i] * rescale[i] + S::reduce_add(lsum);
    }
    // the values: four queries to a pass over the block's rows where the registers hold their sums (16 with a head
    // of 64 on AVX-512), else two, each row loaded once for all of them
    int todo[kQueries], n_todo = 0;
    for (int i = 0; i < nq; ++i)
      if (!skip[i]) todo[n_todo++] = i;
    int t = 0;
    if constexpr (ND > 0 && ND <= 4 && S::kRegs == 32)  // 4 x ND sums, the rows and the weights: <= 32 registers
      for (; t + 3 < n_todo; t += 4) {
        values<ND, 4, E>(acc, p, rescale, todo + t, live, vbase, a.kv_s, j0, n, all_live, D, vn);
        vn = nullptr;  // the first queries to get here prefetched the next block's values
      }
    if constexpr (ND > 0)
      for (; t + 1 < n_todo; t += 2) {
        values<ND, 2, E>(acc, p, rescale, todo + t, live, vbase, a.kv_s, j0, n, all_live, D, vn);
        vn = nullptr;
      }
    for (; t < n_todo; ++t) {
      values<ND, 1, E>(acc, p, rescale, todo + t, live, vbase, a.kv_s, j0, n, all_live, D, vn);
      vn = nullptr;
    }
  }

  // accumulate for the NQ queries todo[0 .. NQ) of the tile.
  template <int ND, int NQ, class E>
  static void values(float (*acc)[kMaxDim], const float (*p)[kKeys], const float* rescale, const int* todo,
                     const Live& live, const E* vbase, int64_t stride, int j0, int n, bool all_live, int D,
                     const E* vn) {
    float* accs[NQ];
    const float* ps[NQ];
    float rs[NQ];
    for (int q = 0; q < NQ; ++q) {
      accs[q] = acc[todo[q]];
      ps[q] = p[todo[q]];
      rs[q] = rescale[todo[q]];
    }
    accumulate<ND, NQ, E>(accs, ps, rs, live, vbase, stride, j0, n, all_live, D, vn);
  }

  // acc[q] = acc[q] * rescale[q] + sum_k p[q][k] v[k] over the block's live keys, for NQ queries at once (each value
  // row loaded once for all of them; each query's operations in the same order whatever NQ). Keys outer, chunks
  // inner: the chunks are independent FMA chains, so a long block is not bound by one accumulator's latency.
  template <int ND, int NQ, class E>
  static void accumulate(float* const* acc, const float* const* p, const float* rescale, const Live& live,
                         const E* vbase, int64_t stride, int j0, int n, bool all_live, int D, const E* vn) {
    const E* vp = vbase + j0 * stride;
    if constexpr (ND > 0) {
      F o[NQ][ND];
      for (int q = 0; q < NQ; ++q)
        for (int c = 0; c < ND; ++c) o[q][c] = S::mul(S::load(acc[q] + 16 * c), S::set1(rescale[q]));
      for (int k = 0; k < n; ++k) {
        if (vn)
          for (int d = 0; d < D; d += kLine<E>) __builtin_prefetch(vn + k * stride + d, 0, 2);
        if (!all_live && !live.contains(j0 + k)) continue;
        F w[NQ];
        for (int q = 0; q < NQ; ++q) w[q] = S::set1(p[q][k]);
#pragma GCC unroll 8
        for (int c = 0; c < ND; ++c) {
          const F v = ldkv<ND>(vp + k * stride, c, D);
          for (int q = 0; q < NQ; ++q) o[q][c] = S::fma(w[q], v, o[q][c]);
        }
      }
      for (int q = 0; q < NQ; ++q)
        for (int c = 0; c < ND; ++c) S::store(acc[q] + 16 * c, o[q][c]);
    } else {
      static_assert(NQ == 1 || ND > 0, "the generic head size takes one query at a time");
      const F r = S::set1(rescale[0]);
      for (int c = 0; c < chunks<ND>(D); ++c) {
        F o = S::mul(ld<ND>(acc[0], c, D), r);
        for (int k = 0; k < n; ++k)
          if (all_live || live.contains(j0 + k)) o = S::fma(S::set1(p[0][k]), ldkv<ND>(vp + k * stride, c, D), o);
        st<ND>(acc[0], c, D, o);
      }
    }
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
