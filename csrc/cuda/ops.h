// The torch-facing functions bindings.cpp registers. Each checks its inputs (messages name the values),
// runs on the current CUDA stream and dispatches on dtype; outputs are allocated by the Python wrappers
// in engine/ops/cuda.py and passed in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace decodescope {

// x, out: [..., hidden]; weight: [hidden]. out may be x.
void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

// residual += x, then x = rmsnorm(residual), both in place.
void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);

// q: [N, H, D], k: [N, Hkv, D] rotated in place; cos, sin: [max_pos, D/2] fp32; positions: [N] int32/int64.
void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions);

// gate_up: [..., 2I] -> out: [..., I].
void silu_mul(at::Tensor& out, const at::Tensor& gate_up);

// q: [B, T, H, D]; k_cache, v_cache: [B, Hkv, S, D]; seq_lens: [B] int32, the T queries' keys included (query t
// sits at p = seq_len - T + t); out: [B, T, H, D]. window 0 attends every key j <= p, else keys j < sinks or
// j > p - window. partials: [B * T, H, splits + groups, D + 4] fp32 and counters: [B * T, H, groups + 1] int32
// (zeroed once) are the workspace; decode_attention_plan sizes it for B rows, whatever T.
void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& seq_lens, double scale, int64_t window, int64_t sinks, at::Tensor& partials,
                      at::Tensor& counters);

// out [T, out_features] = x [T, in] @ W^T (tiles of 16 tokens), W in GGUF blocks of 32 inputs read in place: int8 (Q8_0)
// qs int8 [out, in_pad], d fp16 [out, in_pad / 32], w = d * q; q4 (Q4_1) qs uint8 [out, in_pad / 2] (two nibbles
// a byte, engine/weights/q4_1.py pack_nibbles), d and m fp16 [out, in_pad / 32], w = d * q + m.
void linear_int8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d);
void linear_q4(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m);
// The same GEMV over a dense weight w [out, in] in float16 or bfloat16 (x in any float dtype): each output reduced
// in the same order at every T, where cuBLAS promises none.
void linear_dense(at::Tensor& out, const at::Tensor& x, const at::Tensor& w);

// out [out_features, in] (dense; float32, float16 or bfloat16) = the same blocks dequantized, bit for bit the twin's
// weights.dequantize(blocks) cast to out's dtype: for more than 16 rows, which a GEMM then multiplies.
void dequantize_int8(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d);
void dequantize_q4(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m);

// (splits, groups, blocks per SM) for q's shape, dtype and device with n_kv_heads cache heads: one full wave.
std::tuple<int64_t, int64_t, int64_t> decode_attention_plan(const at::Tensor& q, int64_t n_kv_heads);

}  // namespace decodescope
