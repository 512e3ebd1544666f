// Split-KV single-query decode attention (flash-decoding), GQA-aware.
//
// At batch 1 one block per kv head would leave most SMs idle while it walks the whole cache, so the cache
// is cut into splits of `chunk` keys: grid (split, kv head x head group, batch). A block serves every
// query head of its kv head's group, so each K/V tile is read from HBM once, staged in shared memory by
// cp.async (double-buffered), and used by all of the group's heads. Each block writes unnormalised
// partials (m, l, acc) for its chunk; a second kernel merges the live splits with log-sum-exp.
//
// The live length is read from seq_lens in device memory and the grid is sized for the cache's max length,
// so one launch (and one captured CUDA graph) serves every length: blocks whose chunk starts at or past
// seq_len leave at once, and the merge reads only the ceil(seq_len / chunk) splits that ran. Keys at or
// past seq_len are never loaded, so rolling the cache back is just a write to seq_lens.
#pragma once

#include "common.cuh"
#include "launchers.h"

namespace decodescope {
namespace attention {

constexpr int kTileBytes = 8192;       // one K (or V) tile; 2 stages x (K, V) = 32 KB of static smem
constexpr int kMaxHeadsPerBlock = 8;   // bigger GQA groups take several blocks (K/V then re-read from L2)
constexpr int kTargetThreads = 128;    // grow the key-parallel dimension up to this block size
constexpr float kLog2e = 1.4426950408889634f;

// Thread (tx, ty, tz): tx owns kVec dims of the head dim, ty one query head of the group, tz every
// key_slots-th key of a tile. The kLanes threads with the same (ty, tz) are adjacent lanes of one warp.
template <typename T, int D>
struct Shape {
  static constexpr int kVec = kVec16<T>;                                   // elements per 16-byte load
  static constexpr int kLanes = D / kVec;                                  // threads per key row: 8..32
  static constexpr int kTile = kTileBytes / (D * static_cast<int>(sizeof(T)));  // keys per tile
  static_assert(kLanes >= 8 && kLanes <= 32 && 32 % kLanes == 0, "a key row must fit one warp");
};

template <typename T, int D>
__global__ void __launch_bounds__(256) split_kernel(const DecodeAttentionArgs<T> a, int head_groups) {
  using S = Shape<T, D>;
  constexpr int kVec = S::kVec, kLanes = S::kLanes, kTile = S::kTile;
  __shared__ __align__(16) unsigned char smem[4 * kTileBytes];

  const int split = blockIdx.x, kv_head = blockIdx.y / head_groups, b = blockIdx.z;
  const int len = min(max(a.seq_lens[b], 0), a.max_len);
  const int start = split * a.chunk;
  if (start >= len) return;  // uniform across the block and before any barrier
  const int end = min(start + a.chunk, len);

  const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z;
  const int heads_per_block = blockDim.y, key_slots = blockDim.z;
  const int tid = tx + kLanes * (ty + heads_per_block * tz);
  const int n_threads = kLanes * heads_per_block * key_slots;
  const int group = a.n_heads / a.n_kv_heads;
  const int g = (blockIdx.y % head_groups) * heads_per_block + ty;
  const bool live_head = g < group;  // the last head group may be partly empty
  const int head = kv_head * group + g;
  const int lane = tid % 32;
  const unsigned row_mask = kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1u) << (lane - tx);

  // Scores are kept in log2 units (scale * log2 e folded into q) so that exp is one exp2f.
  float q[kVec];
  const T* qp = a.q + b * a.q_stride_b + head * a.q_stride_h + tx * kVec;
#pragma unroll
  for (int e = 0; e < kVec; ++e) q[e] = live_head ? to_float(qp[e]) * (a.scale * kLog2e) : 0.f;

  T* k_tiles = reinterpret_cast<T*>(smem);  // [2 stages][kTile][D]
  T* v_tiles = k_tiles + 2 * kTile * D;
  const T* k_base = a.k_cache + b * a.kv_stride_b + kv_head * a.kv_stride_h;
  const T* v_base = a.v_cache + b * a.kv_stride_b + kv_head * a.kv_stride_h;
  auto load_tile = [&](int stage, int first) {
    const int keys = min(kTile, end - first);
    for (int i = tid; i < keys * kLanes; i += n_threads) {
      const int key = i / kLanes, part = i % kLanes;
      const int64_t src = static_cast<int64_t>(first + key) * a.kv_stride_s + part * kVec;
      const int dst = (stage * kTile + key) * D + part * kVec;
      __pipeline_memcpy_async(k_tiles + dst, k_base + src, 16);
      __pipeline_memcpy_async(v_tiles + dst, v_base + src, 16);
    }
  };

  float m = -INFINITY, l = 0.f, acc[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) acc[e] = 0.f;

  const int n_tiles = ceil_div(end - start, kTile);
  load_tile(0, start);
  __pipeline_commit();
  for (int t = 0; t < n_tiles; ++t) {
    const int first = start + t * kTile;
    if (t + 1 < n_tiles) load_tile((t + 1) & 1, first + kTile);
    __pipeline_commit();        // possibly empty, so the group count is the same in every thread
    __pipeline_wait_prior(1);   // this thread's copies of tile t have landed ...
    __syncthreads();            // ... and everyone else's
    if (live_head) {
      const T* k_tile = k_tiles + (t & 1) * kTile * D + tx * kVec;
      const T* v_tile = v_tiles + (t & 1) * kTile * D + tx * kVec;
      const int keys = min(kTile, end - first);
      for (int key = tz; key < keys; key += key_slots) {
        const Vec<T, kVec> kv = load_vec<T, kVec>(k_tile + key * D);
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) s += q[e] * to_float(kv.v[e]);
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset >>= 1) s += __shfl_xor_sync(row_mask, s, offset, kLanes);
        // Online softmax; the first key has m = -inf, so rescale = exp2(-inf) = 0.
        const float m_new = fmaxf(m, s);
        const float rescale = exp2f(m - m_new), p = exp2f(s - m_new);
        l = l * rescale + p;
        const Vec<T, kVec> vv = load_vec<T, kVec>(v_tile + key * D);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] = acc[e] * rescale + p * to_float(vv.v[e]);
        m = m_new;
      }
    }
    __syncthreads();  // the next iteration's copies overwrite the stage just read
  }
  __pipeline_wait_prior(0);

  if (key_slots > 1) {  // fold the key slots into slot 0; the tiles are free to reuse after the barrier above
    float* red_acc = reinterpret_cast<float*>(smem);                // [key_slots][heads_per_block][D]
    float* red_ml = red_acc + key_slots * heads_per_block * D;      // [key_slots][heads_per_block][2]
    const int slot = tz * heads_per_block + ty;
#pragma unroll
    for (int e = 0; e < kVec; ++e) red_acc[slot * D + tx * kVec + e] = acc[e];
    if (tx == 0) {
      red_ml[2 * slot] = m;
      red_ml[2 * slot + 1] = l;
    }
    __syncthreads();
    if (tz != 0) return;  // no barrier follows
    m = -INFINITY;
    for (int z = 0; z < key_slots; ++z) m = fmaxf(m, red_ml[2 * (z * heads_per_block + ty)]);
    l = 0.f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = 0.f;
    for (int z = 0; z < key_slots; ++z) {
      const int zs = z * heads_per_block + ty;
      const float mz = red_ml[2 * zs];
      const float w = mz == -INFINITY ? 0.f : exp2f(mz - m);  // a slot that saw no key adds nothing
      l += red_ml[2 * zs + 1] * w;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += red_acc[zs * D + tx * kVec + e] * w;
    }
  }
  if (!live_head) return;
  const int64_t idx = (static_cast<int64_t>(b) * a.n_heads + head) * a.splits + split;
#pragma unroll
  for (int e = 0; e < kVec; ++e) a.partial_acc[idx * D + tx * kVec + e] = acc[e];
  if (tx == 0) {
    a.partial_ml[2 * idx] = m;
    a.partial_ml[2 * idx + 1] = l;
  }
}

// grid (n_heads, batch), one thread per output dim: out = sum_i acc_i 2^(m_i - M) / sum_i l_i 2^(m_i - M)
// over the live splits only (the others were not written this step and may hold stale values).
template <typename T, int D>
__global__ void __launch_bounds__(D) merge_kernel(const DecodeAttentionArgs<T> a) {
  const int head = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int len = min(max(a.seq_lens[b], 0), a.max_len);
  const int live = ceil_div(len, a.chunk);
  const int64_t base = (static_cast<int64_t>(b) * a.n_heads + head) * a.splits;
  const float* ml = a.partial_ml + 2 * base;
  const float* acc = a.partial_acc + base * D + d;
  float m = -INFINITY;
  for (int i = 0; i < live; ++i) m = fmaxf(m, ml[2 * i]);
  float l = 0.f, o = 0.f;
  for (int i = 0; i < live; ++i) {
    const float w = exp2f(ml[2 * i] - m);
    l += ml[2 * i + 1] * w;
    o += acc[static_cast<int64_t>(i) * D] * w;
  }
  // seq_len 0 has no keys to attend to: write zeros rather than 0/0.
  a.out[(static_cast<int64_t>(b) * a.n_heads + head) * D + d] = from_float<T>(live > 0 ? o / l : 0.f);
}

template <typename T, int D>
cudaError_t launch_for_head_dim(const DecodeAttentionArgs<T>& a, cudaStream_t stream) {
  using S = Shape<T, D>;
  const int group = a.n_heads / a.n_kv_heads;
  const int head_groups = ceil_div(group, kMaxHeadsPerBlock);
  const int heads_per_block = ceil_div(group, head_groups);
  int key_slots = 1;
  while (2 * key_slots * S::kLanes * heads_per_block <= kTargetThreads) key_slots *= 2;
  const dim3 block(S::kLanes, heads_per_block, key_slots);  // at most 32 * 8 = 256 threads
  const dim3 grid(a.splits, a.n_kv_heads * head_groups, a.batch);
  const cudaError_t err = launch(split_kernel<T, D>, grid, block, stream, a, head_groups);
  if (err != cudaSuccess) return err;
  return launch(merge_kernel<T, D>, dim3(a.n_heads, a.batch), D, stream, a);
}

}  // namespace attention

template <typename T>
cudaError_t launch_decode_attention(const DecodeAttentionArgs<T>& a, cudaStream_t stream) {
  if (a.batch == 0 || a.n_heads == 0) return cudaSuccess;
  if (a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0 || a.chunk <= 0 || a.splits <= 0 ||
      static_cast<int64_t>(a.splits) * a.chunk < a.max_len) {
    return cudaErrorInvalidValue;
  }
  constexpr int V = kVec16<T>;
  if (!aligned16(a.k_cache) || !aligned16(a.v_cache) || a.kv_stride_b % V || a.kv_stride_h % V ||
      a.kv_stride_s % V) {
    return cudaErrorMisalignedAddress;  // cp.async copies whole 16-byte vectors
  }
  switch (a.head_dim) {
    case 64: return attention::launch_for_head_dim<T, 64>(a, stream);
    case 128: return attention::launch_for_head_dim<T, 128>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace decodescope
