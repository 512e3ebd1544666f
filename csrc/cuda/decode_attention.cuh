// Split-KV decode attention (flash-decoding), GQA-aware, planned on the device, for T queries per row.
//
// Grid (split, kv head x head block, batch row x query), sized once for one full wave of the GPU at T = 1
// (plan_decode_attention), so a captured CUDA graph holds one launch that serves every length. Query t of row b
// sits at position seq_len - T + t and attends keys up to it: a decode step (T = 1) and a verify pass (any T)
// run the same blocks on the same splits (their count is planned for the batch, never for T), so a position's
// output is the same bits whichever pass computes it. Each block reads its query's length and derives
// the live keys (all of them, or the sinks plus the window: the masked middle is skipped, never read), how
// many splits that length deserves (at least kMinTilesPerSplit tiles each: a short context gets short splits,
// as many as its tiles allow, a long one every split of the wave) and its own key range; splits with no work
// leave at once.
//
// A block serves up to 8 query heads of one kv head, all in each thread's registers, so every K and V
// element is read from HBM once and from shared memory once, then used by the whole group. Thread
// (slot, lane): `lane` owns 16 bytes of the head dim, `slot` every kSlots-th key of a tile. Tiles of 8 KB of
// K and of V stream in by cp.async, kStages - 1 tiles ahead (the bytes in flight cost no registers). Per
// tile a thread scores its kKeys keys for all heads, then takes one max and one rescale per head, with
// ex2.approx. Splits then fold their partials together (split_merge.cuh): no merge kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "launchers.h"
#include "split_merge.cuh"

namespace decodescope {
namespace attention {

constexpr int kThreads = 128;
constexpr int kTileBytes = 8192;                 // K (and V) per pipeline stage
constexpr int kStages = 3;                       // 3 x (K, V) x 8 KB = 48 KB, the static shared-memory limit
constexpr int kMinTilesPerSplit = kStages - 1;   // a shorter split cannot fill its own pipeline
constexpr int kMaxHeadsPerBlock = 8;             // bigger GQA groups take several head blocks
constexpr int kMaxSplits = 256;
constexpr int kDirectMergeSplits = 16;           // up to this many splits merge in one level
constexpr float kLog2e = 1.4426950408889634f;

template <typename T, int D, int kHeads>
struct Shape {
  static constexpr int kVec = kVec16<T>;                                        // elements per 16-byte load
  static constexpr int kLanes = D / kVec;                                       // threads across a key row
  static constexpr int kSlots = kThreads / kLanes;                              // key rows in flight
  static constexpr int kTile = kTileBytes / (D * static_cast<int>(sizeof(T)));  // keys per stage
  static constexpr int kKeys = kTile / kSlots;                                  // keys per thread per stage
  static_assert(kLanes >= 8 && kLanes <= 32 && kKeys >= 1 && kTile % kSlots == 0, "tile shape");
};

__host__ __device__ constexpr int imin(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int imax(int a, int b) { return a > b ? a : b; }

// The keys a row attends, as virtual keys [0, n): virtual key v is cache position v below `head` (the sinks)
// and v + gap above (the window). Without a window, or once sinks and window cover the row, gap is 0.
struct LiveKeys {
  int n, head, gap;
  __host__ __device__ int position(int v) const { return v < head ? v : v + gap; }
};

__host__ __device__ inline LiveKeys live_keys(int len, int window, int sinks) {
  if (window > 0 && len > sinks + window) return {sinks + window, sinks, len - window - sinks};
  return {len, len, 0};
}

// Splits that get work for n live keys: `active` splits of tiles_per_split tiles (the last may be shorter).
struct SplitPlan {
  int tiles_per_split, active;
};

__host__ __device__ inline SplitPlan plan_splits(int n, int tile_keys, int splits) {
  const int tiles = ceil_div(n, tile_keys);
  const int want = imax(1, imin(splits, ceil_div(tiles, kMinTilesPerSplit)));
  const int per = imax(1, ceil_div(tiles, want));
  return {per, imax(1, ceil_div(tiles, per))};
}

template <typename T, int D, int kHeads>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeAttentionArgs<T> a) {
  using S = Shape<T, D, kHeads>;
  constexpr int kVec = S::kVec, kLanes = S::kLanes, kSlots = S::kSlots, kTile = S::kTile, kKeys = S::kKeys;
  __shared__ __align__(16) unsigned char smem[kStages * 2 * kTileBytes];

  const int split = blockIdx.x, query_row = blockIdx.z;
  const int b = query_row / a.tokens, t_query = query_row % a.tokens;
  const int len = imin(imax(a.seq_lens[b] - (a.tokens - 1 - t_query), 0), a.max_len);
  const LiveKeys live = live_keys(len, a.window, a.sinks);
  const SplitPlan plan = plan_splits(live.n, kTile, a.splits);
  if (split >= plan.active) return;  // uniform across the block and before any barrier
  const int v_begin = split * plan.tiles_per_split * kTile;
  const int v_end = imin(live.n, v_begin + plan.tiles_per_split * kTile);

  const int group = a.n_heads / a.n_kv_heads;
  const int head_blocks = gridDim.y / a.n_kv_heads, per_block = ceil_div(group, head_blocks);
  const int kv_head = blockIdx.y / head_blocks, g0 = (blockIdx.y % head_blocks) * per_block;
  const int n_heads = imin(per_block, group - g0);  // heads this block serves; the rest of kHeads is padding
  const int head0 = kv_head * group + g0;
  const int tx = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;

  // Scores in log2 units (scale * log2 e folded into q), so softmax's exp is one ex2.
  float q[kHeads][kVec];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const T* qp = a.q + b * a.q_stride_b + t_query * a.q_stride_t + (head0 + h) * a.q_stride_h + tx * kVec;
#pragma unroll
    for (int e = 0; e < kVec; ++e) q[h][e] = h < n_heads ? to_float(qp[e]) * (a.scale * kLog2e) : 0.f;
  }

  // A thread copies exactly the 16-byte pieces it later reads (rows j * kSlots + slot, bytes of lane tx), so
  // its own cp.async wait is all the synchronisation the pipeline needs: no barrier per tile.
  T* k_tiles = reinterpret_cast<T*>(smem);  // [kStages][kTile][D]
  T* v_tiles = k_tiles + kStages * kTile * D;
  const int64_t kv_base = b * a.kv_stride_b + kv_head * a.kv_stride_h + tx * kVec;
  auto load_tile = [&](int stage, int first) {
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const int row = j * kSlots + slot, v = first + row;
      const bool in = v < v_end;  // past the split's end: zero-fill, nothing read
      const int64_t src = kv_base + static_cast<int64_t>(live.position(in ? v : v_begin)) * a.kv_stride_s;
      const int dst = (stage * kTile + row) * D + tx * kVec;
      cp_async16(k_tiles + dst, a.k_cache + src, !in);
      cp_async16(v_tiles + dst, a.v_cache + src, !in);
    }
  };

  float m[kHeads], l[kHeads], acc[kHeads][kVec];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[h][e] = 0.f;
  }

  const int n_tiles = ceil_div(v_end - v_begin, kTile);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, v_begin + s * kTile);
    __pipeline_commit();
  }
  for (int t = 0; t < n_tiles; ++t) {
    __pipeline_wait_prior(kStages - 2);  // this thread's copies of tile t have landed
    const int first = v_begin + t * kTile, stage = t % kStages;
    const T* k_row = k_tiles + (stage * kTile + slot) * D + tx * kVec;
    const T* v_row = v_tiles + (stage * kTile + slot) * D + tx * kVec;

    float s[kKeys][kHeads];
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const Vec<T, kVec> kv = load_vec<T, kVec>(k_row + j * kSlots * D);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot += q[h][e] * to_float(kv.v[e]);
        s[j][h] = dot;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset >>= 1) {
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
#pragma unroll
        for (int h = 0; h < kHeads; ++h) s[j][h] += __shfl_xor_sync(0xffffffffu, s[j][h], offset);
      }
    }
    if (first + kTile > v_end) {  // only the split's last tile can hold keys past its end (zero-filled)
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        if (first + j * kSlots + slot >= v_end) {
#pragma unroll
          for (int h = 0; h < kHeads; ++h) s[j][h] = -INFINITY;
        }
      }
    }
    // One max and one rescale per head per tile. A slot that has seen no live key yet has max -inf; it
    // subtracts 0 instead, so every exp2 argument stays -inf or finite (2^-inf = 0, never NaN).
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int j = 0; j < kKeys; ++j) m_new = fmaxf(m_new, s[j][h]);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float rescale = fast_exp2(m[h] - base);
      m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kKeys; ++j) {
        s[j][h] = fast_exp2(s[j][h] - base);
        sum += s[j][h];
      }
      l[h] = l[h] * rescale + sum;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[h][e] *= rescale;
    }
#pragma unroll
    for (int j = 0; j < kKeys; ++j) {
      const Vec<T, kVec> vv = load_vec<T, kVec>(v_row + j * kSlots * D);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float x = to_float(vv.v[e]);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) acc[h][e] += s[j][h] * x;
      }
    }
    // The stage read above is refilled only after this thread's reads: the loads feed the math above.
    const int next = t + kStages - 1;
    if (next < n_tiles) load_tile(next % kStages, v_begin + next * kTile);
    __pipeline_commit();  // possibly empty, so that the wait count above stays right
  }
  __pipeline_wait_prior(0);
  __syncthreads();  // every thread is done with the tiles: reuse them for the slots' states

  // The slots' states become rows in shared memory; merging them is the block's state per head, and that
  // is the output when the block holds the whole row, else the split's partial row.
  using Row = PartialRow<D>;
  float* states = reinterpret_cast<float*>(smem);  // row (slot, h) at (slot * kHeads + h) * Row::kFloats
  static_assert(kSlots * kHeads * Row::kFloats * 4 <= kStages * 2 * kTileBytes, "slot states fit the tiles");
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    float* row = states + (slot * kHeads + h) * Row::kFloats;
#pragma unroll
    for (int e = 0; e < kVec; ++e) row[tx * kVec + e] = acc[h][e];
    if (tx == 0) {
      row[Row::kMax] = m[h];
      row[Row::kSum] = l[h];
    }
  }
  __syncthreads();
  const int rows = a.splits + a.groups;  // per (batch row, head) in the workspace
  const int64_t head0_row = static_cast<int64_t>(query_row) * a.n_heads + head0;  // out, workspace: [B * T, H, ...]
  const int64_t head_rows = static_cast<int64_t>(rows) * Row::kFloats;
  float* partials = a.partials + head0_row * head_rows;  // this block's first head
  T* out = a.out + head0_row * D;
  merge_rows<T, D, false>(states, Row::kFloats, kHeads * Row::kFloats, kSlots, n_heads,
                          partials + split * Row::kFloats, head_rows, plan.active == 1 ? out : nullptr);
  if (plan.active == 1) return;

  int* counters = a.counters + head0_row * (a.groups + 1);
  const int fan = ceil_div(a.splits, a.groups), n_groups = ceil_div(plan.active, fan), grp = split / fan;
  const int members = imin(fan, plan.active - grp * fan);
  if (!arrive_last(counters + grp, members)) return;
  float* group_row = partials + (a.splits + grp) * Row::kFloats;
  merge_rows<T, D, true>(partials + grp * fan * Row::kFloats, head_rows, Row::kFloats, members, n_heads, group_row,
                         head_rows, n_groups == 1 ? out : nullptr);
  if (n_groups == 1 || !arrive_last(counters + a.groups, n_groups)) return;
  merge_rows<T, D, true>(partials + a.splits * Row::kFloats, head_rows, Row::kFloats, n_groups, n_heads, nullptr, 0,
                         out);
}

// Calls fn with the kernel instance for head_dim and a block's heads (the smallest kHeads that holds them).
template <typename T, typename Fn>
cudaError_t with_kernel(int head_dim, int heads, Fn&& fn) {
  auto pick = [&](auto d) -> cudaError_t {
    constexpr int D = decltype(d)::value;
    if (heads <= 1) return fn(decode_kernel<T, D, 1>);
    if (heads <= 2) return fn(decode_kernel<T, D, 2>);
    if (heads <= 3) return fn(decode_kernel<T, D, 3>);
    if (heads <= 4) return fn(decode_kernel<T, D, 4>);
    if (heads <= 6) return fn(decode_kernel<T, D, 6>);
    return fn(decode_kernel<T, D, 8>);
  };
  switch (head_dim) {
    case 64: return pick(std::integral_constant<int, 64>{});
    case 128: return pick(std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

inline int head_blocks(int group) { return ceil_div(group, kMaxHeadsPerBlock); }

}  // namespace attention

template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionArgs<T>& a, cudaStream_t stream) {
  if (a.batch == 0 || a.tokens == 0 || a.n_heads == 0) return cudaSuccess;
  if (a.tokens < 0 || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.splits <= 0 || a.groups <= 0 ||
      a.splits > attention::kMaxSplits || a.window < 0 || a.sinks < 0) {
    return cudaErrorInvalidValue;
  }
  constexpr int V = kVec16<T>;
  if (!aligned16(a.k_cache) || !aligned16(a.v_cache) || !aligned16(a.partials) || a.kv_stride_b % V ||
      a.kv_stride_h % V || a.kv_stride_s % V) {
    return cudaErrorMisalignedAddress;  // cp.async copies whole 16-byte vectors
  }
  const int group = a.n_heads / a.n_kv_heads, blocks = attention::head_blocks(group);
  const dim3 grid(a.splits, a.n_kv_heads * blocks, a.batch * a.tokens);
  return attention::with_kernel<T>(a.head_dim, ceil_div(group, blocks), [&](auto kernel) {
    return launch(kernel, grid, dim3(attention::kThreads), stream, a);
  });
}

template <typename T>
cudaError_t plan_decode_attention(int batch, int n_heads, int n_kv_heads, int head_dim, int sm_count,
                                  DecodeAttentionPlan* plan) {
  if (batch <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || sm_count <= 0) return cudaErrorInvalidValue;
  const int group = n_heads / n_kv_heads, blocks = attention::head_blocks(group);
  int per_sm = 0;
  const cudaError_t err = attention::with_kernel<T>(head_dim, ceil_div(group, blocks), [&](auto kernel) {
    return max_blocks_per_sm(&per_sm, kernel, attention::kThreads);
  });
  if (err != cudaSuccess) return err;
  const int64_t pairs = static_cast<int64_t>(batch) * n_kv_heads * blocks;
  const int64_t wave = static_cast<int64_t>(sm_count) * (per_sm > 0 ? per_sm : 1);
  const int splits = static_cast<int>(std::min<int64_t>(attention::kMaxSplits, std::max<int64_t>(1, wave / pairs)));
  int fan = splits;  // one merge level, or about sqrt(splits) per group and as many groups
  if (splits > attention::kDirectMergeSplits) {
    fan = 1;
    while (fan * fan < splits) ++fan;
  }
  *plan = {splits, ceil_div(splits, fan), per_sm};
  return cudaSuccess;
}

}  // namespace decodescope
