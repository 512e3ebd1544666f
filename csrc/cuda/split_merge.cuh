// Merging split-KV partials inside the split kernel: no second launch, no serial pass over the splits.
//
// Every split writes a partial row (its unnormalised output o, its max m in log2 units and its sum of exp l)
// and then arrives at its merge group's counter. The last block to arrive in a group merges the group's
// rows; with more than one group, that merged row arrives at a second counter and the last group merges
// the group rows into the output. A block thus reads at most fan + groups rows (about 2 sqrt(splits)), not
// every split, and the merge runs on the SMs that finish last instead of after the whole grid. The last
// arrival resets its counter, so the counters are zero again for the next launch (and graph replay).
//
// Row order of one (batch row, head) in the workspace: [0, splits) per split, then [splits, splits + groups)
// per merge group. Merged rows use the same (o, m, l) form: the merge is associative.
#pragma once

#include "common.cuh"

namespace decodescope {
namespace attention {

// The fields of one partial row of D + 4 floats (the 2 pad floats keep every row 16-byte aligned).
template <int D>
struct PartialRow {
  static constexpr int kFloats = D + 4;
  static constexpr int kMax = D, kSum = D + 1;
};

// Called by every thread of the block after its partial writes; true in every thread of the last block to
// arrive, which then sees all of the group's writes (release: fence before the count; acquire: fence after).
__device__ __forceinline__ bool arrive_last(int* counter, int expected) {
  __threadfence();
  __syncthreads();
  int last = 0;
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1) == expected - 1;
    if (last) *counter = 0;  // everyone has arrived: ready for the next launch
  }
  last = __syncthreads_or(last);
  if (last) __threadfence();
  return last != 0;
}

// Merges `count` (o, m, l) rows of each of n_heads heads: row r of head h at src + h * head_stride + r * row_stride
// floats. The result is a row of the same form at dst + h * dst_head_stride or, when out is not null, the
// normalised output at out + h * D, rounded once to T. kL2: the rows come from other blocks, read through L2.
// One thread per 4 floats of a head's output; m and l are reread per thread, a few bytes against o's 16.
template <typename T, int D, bool kL2>
__device__ void merge_rows(const float* src, int64_t head_stride, int row_stride, int count, int n_heads, float* dst,
                           int64_t dst_head_stride, T* out) {
  using Row = PartialRow<D>;
  constexpr int kChunks = D / 4;
  auto load = [](const float* p) {
    if constexpr (kL2) return __ldcg(p);
    return *p;
  };
  for (int item = threadIdx.x; item < n_heads * kChunks; item += blockDim.x) {
    const int h = item / kChunks, c = item % kChunks;
    const float* rows = src + h * head_stride;
    float m = -INFINITY;
    for (int r = 0; r < count; ++r) m = fmaxf(m, load(rows + r * row_stride + Row::kMax));
    const float base = m == -INFINITY ? 0.f : m;  // no row saw a key (seq_len 0): weights 0, not NaN
    float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < count; ++r) {
      const float* row = rows + r * row_stride;
      const float w = fast_exp2(load(row + Row::kMax) - base);
      l += load(row + Row::kSum) * w;
      const Vec<float, 4> v = kL2 ? load_float4_cg(row + c * 4) : load_vec<float, 4>(row + c * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += v.v[e] * w;
    }
    if (out == nullptr) {
      float* row = dst + h * dst_head_stride;
      store_vec<float, 4>(row + c * 4, {{o[0], o[1], o[2], o[3]}});
      if (c == 0) {
        row[Row::kMax] = m;
        row[Row::kSum] = l;
      }
    } else {
      Vec<T, 4> y;
#pragma unroll
      for (int e = 0; e < 4; ++e) y.v[e] = from_float<T>(l > 0.f ? o[e] / l : 0.f);  // seq_len 0: zeros
      store_vec<T, 4>(out + h * D + c * 4, y);
    }
  }
}

}  // namespace attention
}  // namespace decodescope
