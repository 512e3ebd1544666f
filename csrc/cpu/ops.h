// The torch-facing functions of the CPU module (bindings.cpp registers them). fp32 activations
// throughout (the CPU model runs in fp32); same names and argument order as the CUDA module's csrc/ops.h
// where one exists. Each checks its inputs (messages name the values), records itself for
// torch.profiler as "decodescope::<name>", and splits its work across threads; outputs are allocated
// by the caller and passed in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace decodescope::cpu {

// x, out: [..., hidden]; weight: [hidden]. out may be x.
void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

// residual += x, then x = rmsnorm(residual) * weight, both in place.
void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);

// q: [N, H, D], k: [N, Hkv, D] rotated in place (dense heads, free token strides); cos, sin:
// [max_pos, D/2]; positions: [N] int32 or int64, each in [0, max_pos).
void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions);

// gate_up: [..., 2I] -> out: [..., I].
void silu_mul(at::Tensor& out, const at::Tensor& gate_up);

// q: [B, T, H, D] (dense heads, free token and batch strides); k_cache, v_cache: [B, Hkv, S, D] with D
// dense; seq_lens: [B] int32, the live length with the T new tokens included; out like q. Query t attends
// keys j <= seq_lens[b] - T + t; with window > 0 only j < sinks or j > p - window.
void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& seq_lens, double scale, int64_t window, int64_t sinks);

// out[T, n_out] = x[T, in] @ W^T, W packed in panels of 16 outputs by engine/weights.py to_panels.
void linear_f32(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);  // w: [P, in, 16] fp32
void linear_f16(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);  // w: [P, in, 16] fp16
// qs: [P, nb, 8, 16, 4] uint8 (q + 128); d: [P, nb, 16] fp16.
// int8: activations quantized per block of 32 (llama.cpp's Q8_0 recipe); q8: activations left fp32 (exact).
void linear_int8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d);
void linear_q8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d);
// qs: [P, nb, 16, 16] uint8 nibble pairs; d, m: [P, nb, 16] fp16. fp32 activations.
void linear_q4(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m);

// The blocks of a cached forward in one call (ops_blocks.cpp), planned once per model and KV cache.
// layers[i]: mlp_norm, the next norm (the final norm after the last block), k_cache and v_cache
// [B, Hkv, S, D], the qkv bias (or an empty tensor), then the packed tensors of qkv, o, gate_up and down,
// whose weight format codes (fp32 0, fp16 1, int8 2, q8 3, q4 4) are formats[4i..4i+3].
class BlockPlan {
 public:
  BlockPlan(std::vector<std::vector<at::Tensor>> layers, std::vector<int64_t> formats, int64_t n_heads,
            int64_t n_kv_heads, int64_t intermediate, double eps, double scale);
  // x = attn_norm_0(h) [N = B*T, C] in; the last block's output (the final norm of h) out; h, the residual
  // stream, updated in place. The new K/V go to positions start..start+T-1 of every row (positions: [N]);
  // attention reads keys below kv_limit, windowed as attention() says.
  at::Tensor run(const at::Tensor& x, at::Tensor& h, const at::Tensor& positions, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& seq_lens, int64_t start, int64_t kv_limit, int64_t window,
                 int64_t sinks) const;

 private:
  std::vector<std::vector<at::Tensor>> layers_;
  std::vector<int64_t> formats_;
  int64_t n_heads_, n_kv_heads_, intermediate_, batch_ = 0, max_len_ = 0, head_dim_ = 0;
  double eps_, scale_;
};

std::string isa();          // the kernel table in use, e.g. "avx512 (vnni)"
std::string unsupported();  // "" when this CPU can run the kernels, else what it lacks
void set_isa(const std::string& name);  // "avx2" | "avx512"; raises if this CPU lacks it

}  // namespace decodescope::cpu
