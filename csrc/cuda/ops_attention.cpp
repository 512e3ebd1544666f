// Torch-facing host code for split-KV decode attention (kernels in decode_attention.cuh) and its plan.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "checks.h"
#include "launchers.h"
#include "ops.h"

namespace decodescope {

void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& seq_lens, double scale, int64_t window, int64_t sinks, at::Tensor& partials,
                      at::Tensor& counters) {
  check_cuda(q, "q", q);
  check_cuda(out, "out", q);
  check_cuda(k_cache, "k_cache", q);
  check_cuda(v_cache, "v_cache", q);
  check_cuda(seq_lens, "seq_lens", q);
  check_cuda(partials, "partials", q);
  check_cuda(counters, "counters", q);
  TORCH_CHECK(q.dim() == 4, "q must be [B, T, H, D], got ", q.sizes());
  const int64_t b = q.size(0), t = q.size(1), h = q.size(2), d = q.size(3);
  TORCH_CHECK(d == 64 || d == 128, "head_dim must be 64 or 128, got D = ", d, " (the kernel is compiled for those)");
  check_dense_heads(q, "q");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == b && k_cache.size(3) == d,
              "k_cache must be [B, Hkv, S, D] = [", b, ", Hkv, S, ", d, "], got ", k_cache.sizes());
  const int64_t hkv = k_cache.size(1), s = k_cache.size(2);
  TORCH_CHECK(hkv > 0 && h % hkv == 0, "q heads H = ", h, " must be a multiple of cache heads Hkv = ", hkv);
  TORCH_CHECK(s > 0, "the cache must hold at least one position, got S = ", s);
  TORCH_CHECK(k_cache.stride(3) == 1, "k_cache's last dim must be dense, got strides ", k_cache.strides());
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && v_cache.strides() == k_cache.strides(),
              "v_cache must match k_cache's shape ", k_cache.sizes(), " and strides ", k_cache.strides(), ", got ",
              v_cache.sizes(), " and ", v_cache.strides());
  check_dtype(k_cache, "k_cache", q.scalar_type());
  check_dtype(v_cache, "v_cache", q.scalar_type());
  check_dtype(out, "out", q.scalar_type());
  const int64_t vec = 16 / static_cast<int64_t>(q.element_size());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(k_cache.data_ptr()) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(v_cache.data_ptr()) % 16 == 0 && k_cache.stride(0) % vec == 0 &&
                  k_cache.stride(1) % vec == 0 && k_cache.stride(2) % vec == 0,
              "k_cache and v_cache must start 16-byte aligned with strides that are multiples of ", vec,
              " elements, got strides ", k_cache.strides());
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == b && seq_lens.scalar_type() == at::kInt,
              "seq_lens must be int32 [B] = [", b, "], got ", seq_lens.scalar_type(), " ", seq_lens.sizes());
  check_dense(seq_lens, "seq_lens");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must be [B, T, H, D] = ", q.sizes(), ", got ", out.sizes());
  check_dense(out, "out");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0, "out must start 16-byte aligned");
  TORCH_CHECK(window >= 0 && sinks >= 0, "window and sinks must be >= 0, got window = ", window, ", sinks = ", sinks);

  const int64_t rows = b * t;  // one per query
  TORCH_CHECK(counters.dim() == 3 && counters.size(0) == rows && counters.size(1) == h && counters.size(2) >= 2,
              "counters must be [B * T, H, groups + 1] = [", rows, ", ", h, ", groups + 1] with groups >= 1, got ",
              counters.sizes());
  const int64_t groups = counters.size(2) - 1;
  TORCH_CHECK(partials.dim() == 4 && partials.size(0) == rows && partials.size(1) == h &&
                  partials.size(2) > groups && partials.size(3) == d + 4,
              "partials must be [B * T, H, splits + groups, D + 4] = [", rows, ", ", h, ", splits + ", groups, ", ",
              d + 4, "], got ", partials.sizes());
  const int64_t splits = partials.size(2) - groups;
  TORCH_CHECK(groups <= splits, "the workspace must have no more merge groups (", groups, ") than splits (", splits,
              ")");
  check_dtype(partials, "partials", at::kFloat);
  check_dtype(counters, "counters", at::kInt);
  check_dense(partials, "partials");
  check_dense(counters, "counters");
  TORCH_CHECK(rows <= 65535 && hkv * ((h / hkv + 7) / 8) <= 65535, "B * T = ", rows, " and Hkv = ", hkv,
              " exceed the kernel's grid limits (65535)");

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device());
  dispatch_float(q.scalar_type(), "q", [&](auto zero) {
    using T = decltype(zero);
    DecodeAttentionArgs<T> args{};
    args.out = ptr<T>(out);
    args.q = ptr<T>(q);
    args.k_cache = ptr<T>(k_cache);
    args.v_cache = ptr<T>(v_cache);
    args.seq_lens = ptr<int>(seq_lens);
    args.partials = ptr<float>(partials);
    args.counters = ptr<int>(counters);
    args.batch = static_cast<int>(b);
    args.tokens = static_cast<int>(t);
    args.n_heads = checked_int(h, "H");
    args.n_kv_heads = static_cast<int>(hkv);
    args.head_dim = static_cast<int>(d);
    args.max_len = checked_int(s, "S");
    args.window = checked_int(window, "window");
    args.sinks = checked_int(sinks, "sinks");
    args.splits = checked_int(splits, "splits");
    args.groups = checked_int(groups, "groups");
    args.q_stride_b = q.stride(0);
    args.q_stride_t = q.stride(1);
    args.q_stride_h = q.stride(2);
    args.kv_stride_b = k_cache.stride(0);
    args.kv_stride_h = k_cache.stride(1);
    args.kv_stride_s = k_cache.stride(2);
    args.scale = static_cast<float>(scale);
    check_launch(launch_decode_attention<T>(args, stream), "decode_attention");
  });
}

std::tuple<int64_t, int64_t, int64_t> decode_attention_plan(const at::Tensor& q, int64_t n_kv_heads) {
  check_cuda(q, "q", q);
  TORCH_CHECK(q.dim() == 3, "q must be [B, H, D], got ", q.sizes());
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "head_dim must be 64 or 128, got D = ", q.size(2),
              " (the kernel is compiled for those)");
  TORCH_CHECK(n_kv_heads > 0 && q.size(1) % n_kv_heads == 0, "q heads H = ", q.size(1),
              " must be a multiple of cache heads Hkv = ", n_kv_heads);
  const c10::cuda::CUDAGuard guard(q.device());
  int sms = 0;
  check_launch(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, q.get_device()), "decode_attention_plan");
  DecodeAttentionPlan plan{};
  dispatch_float(q.scalar_type(), "q", [&](auto zero) {
    using T = decltype(zero);
    const cudaError_t err = plan_decode_attention<T>(checked_int(q.size(0), "B"), checked_int(q.size(1), "H"),
                                                     static_cast<int>(n_kv_heads), checked_int(q.size(2), "D"), sms,
                                                     &plan);
    TORCH_CHECK(err == cudaSuccess, "decode_attention_plan: ", cudaGetErrorString(err), " for q ", q.sizes(),
                " with Hkv = ", n_kv_heads);
  });
  return {plan.splits, plan.groups, plan.blocks_per_sm};
}

}  // namespace decodescope
