// Torch-facing host code for attention over the static cache (kernels in attention.h): check, count the
// key splits, run them across threads, merge.
#include <ATen/record_function.h>

#include <algorithm>
#include <vector>

#include "checks.h"
#include "isa.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

constexpr int kMaxHeadDim = 256;    // attention.h's stack buffers

struct Workspace {
  std::vector<float> acc, ml;
  std::vector<int64_t> keys, bounds;  // runs_of's
};
thread_local Workspace workspace;

// Item bounds of `threads` contiguous runs holding about equal numbers of keys: a split's keys are those of its
// positions below its row's length (a window's cut is not counted), so a run of long splits is a short run of items.
// The default model's 3 heads in 2 runs of equal item counts at 512 positions left one thread 8% more keys.
// In the calling thread's workspace, so a layer's call allocates nothing once the sizes have been seen.
const std::vector<int64_t>& runs_of(const AttentionArgs& a, int64_t items, int threads) {
  std::vector<int64_t>& keys = workspace.keys;  // keys[i]: the keys of items [0, i)
  keys.assign(items + 1, 0);
  for (int64_t item = 0; item < items; ++item) {
    const int split = static_cast<int>(item % a.splits), b = static_cast<int>(item / a.splits / a.n_kv_heads);
    const int hi = std::min(a.seq_lens[b], split_start(split + 1));
    keys[item + 1] = keys[item] + std::max(0, hi - split_start(split));
  }
  std::vector<int64_t>& bounds = workspace.bounds;
  bounds.assign(1, 0);
  for (int t = 1; t < threads; ++t) {
    const int64_t want = keys[items] * t / threads;  // the last bound whose items before it hold at most t shares
    const int64_t at = std::upper_bound(keys.begin(), keys.end(), want) - keys.begin() - 1;
    if (at > bounds.back()) bounds.push_back(at);
  }
  if (bounds.back() < items) bounds.push_back(items);
  return bounds;
}

}  // namespace

void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& seq_lens, double scale, int64_t window, int64_t sinks) {
  RECORD_FUNCTION("decodescope::attention", std::vector<c10::IValue>({q, k_cache, v_cache, seq_lens}));
  check_cpu(q, "q");
  TORCH_CHECK(q.dim() == 4, "q must be [B, T, H, D], got ", q.sizes());
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  check_dtype(q, "q", at::kFloat);
  TORCH_CHECK(D > 0 && D % 2 == 0 && D <= kMaxHeadDim, "head_dim must be even and at most ", kMaxHeadDim,
              ", got D = ", D);
  check_dense_heads(q, "q");
  check_cpu(k_cache, "k_cache");
  check_cpu(v_cache, "v_cache");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == B && k_cache.size(3) == D,
              "k_cache must be [B, Hkv, S, D] = [", B, ", Hkv, S, ", D, "], got ", k_cache.sizes());
  const int64_t Hkv = k_cache.size(1), S = k_cache.size(2);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "q heads H = ", H, " must be a multiple of cache heads Hkv = ", Hkv);
  TORCH_CHECK(k_cache.stride(3) == 1, "k_cache's last dim must be dense, got strides ", k_cache.strides());
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && v_cache.strides() == k_cache.strides(),
              "v_cache must match k_cache's shape ", k_cache.sizes(), " and strides ", k_cache.strides(), ", got ",
              v_cache.sizes(), " and ", v_cache.strides());
  check_kv_dtypes(k_cache, v_cache);
  check_tensor(seq_lens, "seq_lens", at::kInt, "[B]", {B});
  check_cpu(out, "out");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must be [B, T, H, D] = ", q.sizes(), ", got ", out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense_heads(out, "out");
  TORCH_CHECK(window >= 0 && sinks >= 0, "window and sinks must be >= 0, got window = ", window, ", sinks = ", sinks);
  if (B == 0 || T == 0 || H == 0) return;

  // seq_lens is host memory here: check it, and find the longest row for the split plan.
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(lens[b] >= T && lens[b] <= S, "seq_lens[", b, "] = ", lens[b], " must be in [T, S] = [", T, ", ",
                S, "]: it counts the T new tokens, whose keys are already in the cache");
    longest = std::max<int64_t>(longest, lens[b]);
  }

  AttentionArgs a{};
  a.out = out.data_ptr<float>();
  a.q = q.data_ptr<float>();
  a.k = k_cache.data_ptr();
  a.v = v_cache.data_ptr();
  a.kv_f16 = k_cache.scalar_type() == at::kHalf;
  a.seq_lens = lens;
  a.batch = static_cast<int>(B);
  a.tokens = checked_int(T, "T");
  a.n_heads = checked_int(H, "H");
  a.n_kv_heads = static_cast<int>(Hkv);
  a.head_dim = static_cast<int>(D);
  a.max_len = checked_int(S, "S");
  a.window = checked_int(window, "window");
  a.sinks = checked_int(sinks, "sinks");
  a.q_b = q.stride(0);
  a.q_t = q.stride(1);
  a.out_b = out.stride(0);
  a.out_t = out.stride(1);
  a.kv_b = k_cache.stride(0);
  a.kv_h = k_cache.stride(1);
  a.kv_s = k_cache.stride(2);
  a.scale = static_cast<float>(scale);
  // Splits at fixed positions (kernels.h split_start), not an even share per thread: the same sum order for a
  // query whatever the pass. Each thread takes a contiguous run of items (a row's head's splits in order, runs_of),
  // so it streams that head's keys and values on from one split into the next, prefetching across the boundary
  // (attention.h kAhead); claimed one at a time, a thread's next item was unknown and each split started cold.
  a.splits = splits_for(static_cast<int>(longest));
  const int64_t items = B * Hkv * a.splits, queries = (H / Hkv) * T;
  workspace.acc.resize(items * queries * D);
  workspace.ml.resize(items * queries * 2);
  a.part_acc = workspace.acc.data();
  a.part_ml = workspace.ml.data();

  const KernelTable& k = kernels();
  const std::vector<int64_t>& bounds = runs_of(a, items, at::get_num_threads());
  parallel_chunks(static_cast<int64_t>(bounds.size()) - 1, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) k.attention(a, bounds[r], bounds[r + 1]);
  });
  const int64_t rows = B * T * H;
  parallel_chunks(rows, (8192 + D - 1) / D, [&](int64_t r0, int64_t r1) { k.attention_merge(a, r0, r1); });
}

}  // namespace decodescope::cpu
