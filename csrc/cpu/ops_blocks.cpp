// The transformer blocks of a cached forward (a decode step or a verify pass) in one call: the same kernels,
// in the same order, as engine/model.py's Block.forward with the CPU OpSet, without ~30 Python round trips
// per block (module calls, views, the OpSet's wrappers) between the kernels. engine/model.py's LayerRecord is
// the hand-off: one record per block, passed by field name; a new block feature is a field there, a line in
// LAYER_FIELDS below and its use in run().
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "checks.h"
#include "formats.h"
#include "ops.h"

// The layer record's fields, one line each in engine/model.py LayerRecord's order: (type, name). They become
// BlockPlan::Layer's members, block_fields()' names and the reads of each record by name.
#define LAYER_FIELDS(X)                                                                                         \
  X(Projections, qkv)         /* q, k and v in one GEMM (one per segment) */                                    \
  X(at::Tensor, qkv_bias)     /* [Q + 2 KV], or empty */                                                        \
  X(at::Tensor, q_norm)       /* [D]: an RMSNorm of each q head before rope (Qwen3, Gemma 3), or empty */       \
  X(at::Tensor, k_norm)       /* [D]: the same on k, present exactly when q_norm is */                          \
  X(at::Tensor, cos)          /* [max_pos, D/2]: this layer's rope table (Gemma 3's local layers own one) */    \
  X(at::Tensor, sin)                                                                                            \
  X(at::Tensor, k_cache)      /* [B, Hkv, S, D], the same shape in every block */                               \
  X(at::Tensor, v_cache)                                                                                        \
  X(int64_t, window)          /* this layer's own sliding window; 0: the run's window and sinks */              \
  X(int64_t, n_heads)                                                                                           \
  X(int64_t, n_kv_heads)                                                                                        \
  X(double, scale)            /* the attention's score scale */                                                 \
  X(Projections, o)                                                                                             \
  X(at::Tensor, post_attn_norm) /* [C]: on the attention's output before its add (Gemma), or empty */           \
  X(at::Tensor, mlp_norm)     /* [C] */                                                                         \
  X(Projections, gate_up)     /* [gate | up] in one GEMM (one per segment) */                                   \
  X(std::string, activation)  /* the gate: "silu" or "gelu_tanh" */                                             \
  X(int64_t, intermediate)                                                                                      \
  X(Projections, down)                                                                                          \
  X(at::Tensor, post_mlp_norm) /* [C]: on the MLP's output before its add (Gemma), or empty */                  \
  X(at::Tensor, next_norm)    /* [C]: the next block's attn_norm, the final norm after the last block */        \
  X(double, eps)              /* every norm's epsilon */

namespace decodescope::cpu {
namespace {

// k, v: [B, T, Hkv, D] views with the same strides (dense heads) into the caches [B, Hkv, S, D] (the same
// strides too) at positions start..start+T-1.
// Rows of D floats into a cache of element E: copied, or rounded to fp16 to nearest even as torch's copy_ rounds.
template <class E>
void write_kv_as(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  const int64_t B = k.size(0), T = k.size(1), Hkv = k.size(2), D = k.size(3);
  E *kc = static_cast<E*>(k_cache.data_ptr()), *vc = static_cast<E*>(v_cache.data_ptr());
  const float *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t dst = b * k_cache.stride(0) + h * k_cache.stride(1) + (start + t) * k_cache.stride(2);
        const int64_t src = b * k.stride(0) + t * k.stride(1) + h * k.stride(2);
        if constexpr (std::is_same_v<E, float>) {
          std::memcpy(kc + dst, kp + src, static_cast<size_t>(D) * sizeof(float));
          std::memcpy(vc + dst, vp + src, static_cast<size_t>(D) * sizeof(float));
        } else {
          for (int64_t d = 0; d < D; ++d) {
            kc[dst + d] = c10::Half(kp[src + d]);
            vc[dst + d] = c10::Half(vp[src + d]);
          }
        }
      }
}

void write_kv(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v, int64_t start) {
  RECORD_FUNCTION("decodescope::kv_write", std::vector<c10::IValue>());
  if (k_cache.scalar_type() == at::kHalf) return write_kv_as<c10::Half>(k_cache, v_cache, k, v, start);
  write_kv_as<float>(k_cache, v_cache, k, v, start);
}

}  // namespace

struct BlockPlan::Layer {
#define DECLARE(type, name) type name{};
  LAYER_FIELDS(DECLARE)
#undef DECLARE
  bool geglu = false;  // activation == "gelu_tanh", decided once
};

std::vector<std::string> block_fields() {
#define NAME(type, name) #name,
  return {LAYER_FIELDS(NAME)};
#undef NAME
}

namespace {

const char* kind(const Field& f) {
  static constexpr const char* kKinds[] = {"a tensor", "a projection's segments", "an int", "a float", "a name"};
  return kKinds[f.index()];
}

template <class T>
const char* kind_of() {
  return kind(Field{T{}});
}

// field `name` of layer i's record, which must hold a T
template <class T>
void read(T& out, const LayerRecord& record, const char* name, size_t i) {
  const auto it = record.find(name);
  TORCH_CHECK(it != record.end(), "layer ", i, ": the record has no field '", name,
              "' (engine/model.py LayerRecord and csrc/cpu/ops_blocks.cpp LAYER_FIELDS must list the same fields)");
  const T* value = std::get_if<T>(&it->second);
  TORCH_CHECK(value != nullptr, "layer ", i, ": ", name, " must be ", kind_of<T>(), ", got ", kind(it->second));
  out = *value;
}

BlockPlan::Layer read_layer(const LayerRecord& record, size_t i) {
  BlockPlan::Layer L;
#define READ(type, name) read(L.name, record, #name, i);
  LAYER_FIELDS(READ)
#undef READ
  const std::vector<std::string> names = block_fields();
  for (const auto& [name, value] : record)
    TORCH_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "layer ", i,
                ": the block loop reads no field '", name, "' (csrc/cpu/ops_blocks.cpp LAYER_FIELDS lists them)");
  TORCH_CHECK(L.activation == "silu" || L.activation == "gelu_tanh", "layer ", i,
              ": activation must be 'silu' or 'gelu_tanh', got '", L.activation, "'");
  L.geglu = L.activation == "gelu_tanh";
  return L;
}

}  // namespace

BlockPlan::BlockPlan(const std::vector<LayerRecord>& records) {
  TORCH_CHECK(!records.empty(), "layers must list at least one block");
  auto layers = std::make_shared<std::vector<Layer>>();
  for (size_t i = 0; i < records.size(); ++i) layers->push_back(read_layer(records[i], i));
  const at::Tensor& first = (*layers)[0].k_cache;
  for (size_t i = 0; i < layers->size(); ++i) {
    const Layer& L = (*layers)[i];
    TORCH_CHECK(L.intermediate > 0, "layer ", i, ": intermediate = ", L.intermediate, " must be positive");
    TORCH_CHECK(L.n_heads > 0 && L.n_kv_heads > 0 && L.n_heads % L.n_kv_heads == 0, "layer ", i, ": n_heads = ",
                L.n_heads, " must be a multiple of n_kv_heads = ", L.n_kv_heads);
    check_cpu(L.k_cache, "k_cache");
    check_kv_dtypes(L.k_cache, L.v_cache, "layer " + std::to_string(i) + ": ");
    TORCH_CHECK(L.k_cache.scalar_type() == first.scalar_type(), "layer ", i, ": k_cache is ",
                L.k_cache.scalar_type(), " where layer 0's is ", first.scalar_type());
    TORCH_CHECK(L.k_cache.dim() == 4 && L.k_cache.size(1) == L.n_kv_heads && L.k_cache.stride(3) == 1 &&
                    L.v_cache.sizes() == L.k_cache.sizes() && L.v_cache.strides() == L.k_cache.strides() &&
                    L.k_cache.sizes() == first.sizes(),
                "layer ", i, ": k_cache and v_cache must be [B, Hkv = ", L.n_kv_heads,
                ", S, D] alike in every layer, got ", L.k_cache.sizes(), " and ", L.v_cache.sizes());
    const int64_t C = L.next_norm.numel(), D = L.k_cache.size(3);
    for (const auto& [name, p, n_out] :
         {std::tuple{"qkv", &L.qkv, (L.n_heads + 2 * L.n_kv_heads) * D}, {"o", &L.o, C},
          {"gate_up", &L.gate_up, 2 * L.intermediate}, {"down", &L.down, C}}) {
      TORCH_CHECK(!p->empty(), "layer ", i, ": ", name, " has no segments");
      int64_t rows = 0;
      for (const Projection& s : *p) {
        const FormatRecord& f = format_record(s.format);
        TORCH_CHECK(static_cast<int>(s.tensors.size()) == f.n_tensors, "layer ", i, ": ", name, " is ", f.name,
                    ", whose weights are ", f.n_tensors, " packed tensor(s), got ", s.tensors.size());
        TORCH_CHECK(s.rows > 0, "layer ", i, ": a segment of ", name, " has ", s.rows, " rows");
        rows += s.rows;
      }
      TORCH_CHECK(rows == n_out, "layer ", i, ": ", name, "'s segments cover ", rows, " output rows, not its ", n_out);
    }
  }
  batch_ = first.size(0);
  max_len_ = first.size(2);
  head_dim_ = first.size(3);
  for (size_t i = 0; i < layers->size(); ++i) {
    const Layer& L = (*layers)[i];
    for (const auto& [name, t] : {std::pair{"q_norm", &L.q_norm}, {"k_norm", &L.k_norm}})
      TORCH_CHECK(t->numel() == 0 || (t->dim() == 1 && t->size(0) == head_dim_), "layer ", i, ": ", name,
                  " must be [D] = [", head_dim_, "] or empty, got ", t->sizes());
    TORCH_CHECK(L.q_norm.numel() == L.k_norm.numel(), "layer ", i, ": q_norm and k_norm come together");
    TORCH_CHECK(L.cos.dim() == 2 && L.cos.size(1) == head_dim_ / 2 && L.sin.sizes() == L.cos.sizes(), "layer ", i,
                ": cos and sin must be [max_pos, D/2] = [max_pos, ", head_dim_ / 2, "], got ", L.cos.sizes(), " and ",
                L.sin.sizes());
    TORCH_CHECK(L.window >= 0, "layer ", i, ": window = ", L.window, " must be >= 0");
  }
  layers_ = std::move(layers);
}

at::Tensor BlockPlan::run(const at::Tensor& x_in, at::Tensor& h, const at::Tensor& positions,
                          const at::Tensor& seq_lens, int64_t start, int64_t kv_limit, int64_t window,
                          int64_t sinks) const {
  check_cpu(h, "h");
  check_dtype(h, "h", at::kFloat);
  check_dense(h, "h");
  TORCH_CHECK(x_in.sizes() == h.sizes(), "x must be shaped like h ", h.sizes(), ", got ", x_in.sizes());
  const int64_t N = h.size(0), C = h.size(1), batch = batch_, D = head_dim_;
  TORCH_CHECK(N % batch == 0, "the cache's batch ", batch, " must divide the ", N, " rows of h");
  const int64_t T = N / batch;
  TORCH_CHECK(start >= 0 && kv_limit >= start + T && kv_limit <= max_len_, "the new positions ", start, "..",
              start + T - 1, " must lie below kv_limit = ", kv_limit, ", at most the cache's ", max_len_);
  const auto f32 = h.options();
  at::Tensor x = x_in.clone(at::MemoryFormat::Contiguous), next = at::empty_like(h), y, y_flat, qkv, o, gate_up, act;
  for (size_t i = 0; i < layers_->size(); ++i) {
    RECORD_FUNCTION("decodescope/layer." + std::to_string(i), std::vector<c10::IValue>());
    const Layer& L = (*layers_)[i];
    const int64_t n_heads = L.n_heads, n_kv_heads = L.n_kv_heads, intermediate = L.intermediate;
    const int64_t Q = n_heads * D, KV = n_kv_heads * D;
    const double eps = L.eps;
    const at::Tensor &mlp_norm = L.mlp_norm, &next_norm = L.next_norm, &bias = L.qkv_bias;
    at::Tensor k_cache = L.k_cache, v_cache = L.v_cache;
    // each segment's kernel writes its slice of out's columns (rows n_out floats apart)
    auto project = [&](const Projections& p, at::Tensor& out, const at::Tensor& in, int64_t n_out) {
      if (!out.defined() || out.size(1) != n_out) out = at::empty({N, n_out}, f32);
      if (p.size() == 1) return linear_packed(out, in, p[0].format, p[0].tensors);
      int64_t at = 0;
      for (const Projection& s : p) {
        at::Tensor slice = out.as_strided({N, s.rows}, {n_out, 1}, out.storage_offset() + at);
        linear_packed(slice, in, s.format, s.tensors);
        at += s.rows;
      }
    };

    // attention: qkv in one GEMM, the q/k head norms and rope on the q and k views, K/V into the cache,
    // attention over it (this layer's own window, or the run's)
    project(L.qkv, qkv, x, Q + 2 * KV);
    if (bias.numel() > 0) qkv.add_(bias);
    // views made with as_strided: narrow + view each go through the dispatcher, a few percent of a step
    const int64_t ld = Q + 2 * KV;
    at::Tensor q = qkv.as_strided({batch, T, n_heads, D}, {T * ld, ld, D, 1}, 0);
    at::Tensor k = qkv.as_strided({batch, T, n_kv_heads, D}, {T * ld, ld, D, 1}, Q);
    const at::Tensor v = qkv.as_strided({batch, T, n_kv_heads, D}, {T * ld, ld, D, 1}, Q + KV);
    at::Tensor q_flat = qkv.as_strided({N, n_heads, D}, {ld, D, 1}, 0);
    at::Tensor k_flat = qkv.as_strided({N, n_kv_heads, D}, {ld, D, 1}, Q);
    if (L.q_norm.numel() > 0) {
      rmsnorm_heads(q_flat, L.q_norm, eps);
      rmsnorm_heads(k_flat, L.k_norm, eps);
    }
    rope(q_flat, k_flat, L.cos, L.sin, positions);
    write_kv(k_cache, v_cache, k, v, start);
    if (!y.defined() || y.size(2) != n_heads) {
      y = at::empty({batch, T, n_heads, D}, f32);
      y_flat = y.view({N, Q});
    }
    at::Tensor kc = k_cache, vc = v_cache;  // the keys below kv_limit
    if (kv_limit < k_cache.size(2)) {
      const std::vector<int64_t> live{batch, n_kv_heads, kv_limit, D};
      kc = k_cache.as_strided(live, k_cache.strides(), k_cache.storage_offset());
      vc = v_cache.as_strided(live, v_cache.strides(), v_cache.storage_offset());
    }
    attention(y, q, kc, vc, seq_lens, L.scale, L.window > 0 ? L.window : window, L.window > 0 ? 0 : sinks);
    project(L.o, o, y_flat, C);
    if (L.post_attn_norm.numel() > 0) rmsnorm(o, o, L.post_attn_norm, eps);
    add_rmsnorm(o, h, mlp_norm, eps);  // h += o; o = mlp_norm(h)

    // MLP: [gate | up] in one GEMM, act(gate) * up, down; the next block's norm folded into the add
    project(L.gate_up, gate_up, o, 2 * intermediate);
    if (!act.defined() || act.size(1) != intermediate) act = at::empty({N, intermediate}, f32);
    if (L.geglu) gelu_tanh_mul(act, gate_up);
    else silu_mul(act, gate_up);
    project(L.down, next, act, C);
    if (L.post_mlp_norm.numel() > 0) rmsnorm(next, next, L.post_mlp_norm, eps);
    add_rmsnorm(next, h, next_norm, eps);  // h += down; next = next_norm(h)
    std::swap(x, next);
  }
  return x;
}

}  // namespace decodescope::cpu
