// The transformer blocks of a cached forward (a decode step or a verify pass) in one call: the same kernels,
// in the same order, as engine/model.py's Block.forward with the CPU OpSet, without ~30 Python round trips
// per block (module calls, views, the OpSet's wrappers), which on the 2-core box cost about as much as the
// q4 GEMMs themselves. engine/ops/cpu.py builds the per-layer lists; model.py says when this path runs.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstring>
#include <utility>
#include <string>
#include <vector>

#include "checks.h"
#include "ops.h"

namespace decodescope::cpu {
namespace {

// Tensors per projection by format code (engine/ops/cpu.py FORMAT_CODES), as engine/weights.py packs them.
constexpr int kFormats = 5;
constexpr int kTensorsPerFormat[kFormats] = {1, 1, 2, 2, 3};  // fp32 w, fp16 w, int8 qs d, q8 qs d, q4 qs d m

void linear(int64_t fmt, at::Tensor& out, const at::Tensor& x, const at::Tensor* w) {
  switch (fmt) {
    case 0: return linear_f32(out, x, w[0]);
    case 1: return linear_f16(out, x, w[0]);
    case 2: return linear_int8(out, x, w[0], w[1]);
    case 3: return linear_q8(out, x, w[0], w[1]);
    case 4: return linear_q4(out, x, w[0], w[1], w[2]);
    default: TORCH_CHECK(false, "unknown weight format code ", fmt, " (0..", kFormats - 1, ")");
  }
}

// k, v: [B, T, Hkv, D] views with the same strides (dense heads) into the caches [B, Hkv, S, D] (the same
// strides too) at positions start..start+T-1.
void write_kv(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  RECORD_FUNCTION("decodescope::kv_write", std::vector<c10::IValue>());
  const int64_t B = k.size(0), T = k.size(1), Hkv = k.size(2), D = k.size(3);
  const size_t bytes = static_cast<size_t>(D) * sizeof(float);
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t dst = b * k_cache.stride(0) + h * k_cache.stride(1) + (start + t) * k_cache.stride(2);
        const int64_t src = b * k.stride(0) + t * k.stride(1) + h * k.stride(2);
        std::memcpy(kc + dst, kp + src, bytes);
        std::memcpy(vc + dst, vp + src, bytes);
      }
}

}  // namespace

BlockPlan::BlockPlan(std::vector<std::vector<at::Tensor>> layers, std::vector<int64_t> formats, int64_t n_heads,
                     int64_t n_kv_heads, int64_t intermediate, double eps, double scale)
    : layers_(std::move(layers)), formats_(std::move(formats)), n_heads_(n_heads), n_kv_heads_(n_kv_heads),
      intermediate_(intermediate), eps_(eps), scale_(scale) {
  TORCH_CHECK(!layers_.empty(), "layers must list at least one block");
  TORCH_CHECK(formats_.size() == 4 * layers_.size(), "formats must hold 4 codes per layer (qkv, o, gate_up, down): ",
              4 * layers_.size(), " for ", layers_.size(), " layers, got ", formats_.size());
  TORCH_CHECK(intermediate > 0, "intermediate = ", intermediate, " must be positive");
  TORCH_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0, "n_heads = ", n_heads,
              " must be a multiple of n_kv_heads = ", n_kv_heads);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::vector<at::Tensor>& L = layers_[i];
    size_t want = 5;
    for (int j = 0; j < 4; ++j) {
      const int64_t f = formats_[4 * i + j];
      TORCH_CHECK(f >= 0 && f < kFormats, "layer ", i, ": unknown weight format code ", f);
      want += kTensorsPerFormat[f];
    }
    TORCH_CHECK(L.size() == want, "layer ", i, " must list ", want, " tensors (mlp_norm, next_norm, k_cache, ",
                "v_cache, qkv bias or an empty tensor, then each projection's packed tensors), got ", L.size());
    const at::Tensor &k_cache = L[2], &v_cache = L[3];
    check_cpu(k_cache, "k_cache");
    check_dtype(k_cache, "k_cache", at::kFloat);
    check_dtype(v_cache, "v_cache", at::kFloat);
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(1) == n_kv_heads && k_cache.stride(3) == 1 &&
                    v_cache.sizes() == k_cache.sizes() && v_cache.strides() == k_cache.strides() &&
                    k_cache.sizes() == layers_[0][2].sizes(),
                "layer ", i, ": k_cache and v_cache must be [B, Hkv = ", n_kv_heads, ", S, D] alike in every layer, got ",
                k_cache.sizes(), " and ", v_cache.sizes());
  }
  batch_ = layers_[0][2].size(0);
  max_len_ = layers_[0][2].size(2);
  head_dim_ = layers_[0][2].size(3);
}

at::Tensor BlockPlan::run(const at::Tensor& x_in, at::Tensor& h, const at::Tensor& positions, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& seq_lens, int64_t start, int64_t kv_limit,
                          int64_t window, int64_t sinks) const {
  check_cpu(h, "h");
  check_dtype(h, "h", at::kFloat);
  check_dense(h, "h");
  TORCH_CHECK(x_in.sizes() == h.sizes(), "x must be shaped like h ", h.sizes(), ", got ", x_in.sizes());
  const int64_t N = h.size(0), C = h.size(1), batch = batch_, D = head_dim_;
  TORCH_CHECK(N % batch == 0, "the cache's batch ", batch, " must divide the ", N, " rows of h");
  const int64_t T = N / batch;
  TORCH_CHECK(start >= 0 && kv_limit >= start + T && kv_limit <= max_len_, "the new positions ", start, "..",
              start + T - 1, " must lie below kv_limit = ", kv_limit, ", at most the cache's ", max_len_);
  const int64_t n_heads = n_heads_, n_kv_heads = n_kv_heads_, intermediate = intermediate_;
  const int64_t Q = n_heads * D, KV = n_kv_heads * D;
  const double eps = eps_, scale = scale_;
  const auto f32 = h.options();
  at::Tensor x = x_in.clone(at::MemoryFormat::Contiguous), next = at::empty_like(h), y, y_flat, qkv, o, gate_up, act;
  for (size_t i = 0; i < layers_.size(); ++i) {
    RECORD_FUNCTION("decodescope/layer." + std::to_string(i), std::vector<c10::IValue>());
    const std::vector<at::Tensor>& L = layers_[i];
    const int64_t* fmt = &formats_[4 * i];
    const at::Tensor &mlp_norm = L[0], &next_norm = L[1], &bias = L[4];
    at::Tensor k_cache = L[2], v_cache = L[3];
    const at::Tensor* w = &L[5];
    auto project = [&](int j, at::Tensor& out, const at::Tensor& in, int64_t n_out) {
      if (!out.defined() || out.size(1) != n_out) out = at::empty({N, n_out}, f32);
      linear(fmt[j], out, in, w);
      w += kTensorsPerFormat[fmt[j]];
    };

    // attention: qkv in one GEMM, rope on the q and k views, K/V into the cache, attention over it
    project(0, qkv, x, Q + 2 * KV);
    if (bias.numel() > 0) qkv.add_(bias);
    // views made with as_strided: narrow + view cost ~2 us each through the dispatcher, ~0.3 ms a step
    const int64_t ld = Q + 2 * KV;
    at::Tensor q = qkv.as_strided({batch, T, n_heads, D}, {T * ld, ld, D, 1}, 0);
    at::Tensor k = qkv.as_strided({batch, T, n_kv_heads, D}, {T * ld, ld, D, 1}, Q);
    const at::Tensor v = qkv.as_strided({batch, T, n_kv_heads, D}, {T * ld, ld, D, 1}, Q + KV);
    at::Tensor q_flat = qkv.as_strided({N, n_heads, D}, {ld, D, 1}, 0);
    at::Tensor k_flat = qkv.as_strided({N, n_kv_heads, D}, {ld, D, 1}, Q);
    rope(q_flat, k_flat, cos, sin, positions);
    write_kv(k_cache, v_cache, k, v, start);
    if (!y.defined()) {
      y = at::empty({batch, T, n_heads, D}, f32);
      y_flat = y.view({N, Q});
    }
    at::Tensor kc = k_cache, vc = v_cache;  // the keys below kv_limit
    if (kv_limit < k_cache.size(2)) {
      const std::vector<int64_t> live{batch, n_kv_heads, kv_limit, D};
      kc = k_cache.as_strided(live, k_cache.strides(), k_cache.storage_offset());
      vc = v_cache.as_strided(live, v_cache.strides(), v_cache.storage_offset());
    }
    attention(y, q, kc, vc, seq_lens, scale, window, sinks);
    project(1, o, y_flat, C);
    add_rmsnorm(o, h, mlp_norm, eps);  // h += o; o = mlp_norm(h)

    // MLP: [gate | up] in one GEMM, silu(gate) * up, down; the next block's norm folded into the add
    project(2, gate_up, o, 2 * intermediate);
    if (!act.defined()) act = at::empty({N, intermediate}, f32);
    silu_mul(act, gate_up);
    project(3, next, act, C);
    add_rmsnorm(next, h, next_norm, eps);  // h += down; next = next_norm(h)
    std::swap(x, next);
  }
  return x;
}

}  // namespace decodescope::cpu
