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

// Merges rows [first, first + count) of heads [head0, head0 + n_heads) (each `rows` rows apart in `partials`)
// into row `dst` of the same heads, or into out (normalised, rounded once to T) when dst < 0. One thread per
// 4 floats of output: m and l of each row are reread per thread, a few bytes against the 16 of o.
template <typename T, int D>
__device__ void merge_rows(float* partials, T* out, int64_t head0_row, int64_t out_head0, int n_heads,
                           int rows, int first, int count, int dst) {
  using Row = PartialRow<D>;
  constexpr int kChunks = D / 4;
  for (int item = threadIdx.x; item < n_heads * kChunks; item += blockDim.x) {
    const int h = item / kChunks, c = item % kChunks;
    const float* base = partials + ((head0_row + h) * rows + first) * Row::kFloats;
    float m = -INFINITY;
    for (int r = 0; r < count; ++r) m = fmaxf(m, __ldcg(base + r * Row::kFloats + Row::kMax));
    float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < count; ++r) {
      const float* row = base + r * Row::kFloats;
      const float w = fast_exp2(__ldcg(row + Row::kMax) - m);  // every merged row saw a live key: m is finite
      l += __ldcg(row + Row::kSum) * w;
      const Vec<float, 4> v = load_float4_cg(row + c * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] += v.v[e] * w;
    }
    if (dst >= 0) {
      float* row = partials + ((head0_row + h) * rows + dst) * Row::kFloats;
      store_vec<float, 4>(row + c * 4, {{o[0], o[1], o[2], o[3]}});
      if (c == 0) {
        row[Row::kMax] = m;
        row[Row::kSum] = l;
      }
    } else {
      Vec<T, 4> y;
#pragma unroll
      for (int e = 0; e < 4; ++e) y.v[e] = from_float<T>(o[e] / l);
      store_vec<T, 4>(out + (out_head0 + h) * D + c * 4, y);
    }
  }
}

}  // namespace attention
}  // namespace decodescope
