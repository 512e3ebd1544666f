// The torch-facing functions bindings.cpp registers. Each checks its inputs (messages name the values),
// runs on the current CUDA stream and dispatches on dtype; outputs are allocated by the Python wrappers
// in engine/ops/fused.py and passed in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace decodescope {

// x, out: [..., hidden]; weight: [hidden]. out may be x.
void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

// residual += x, then x = rmsnorm(residual), both in place.
void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);

// q: [N, H, D], k: [N, Hkv, D] rotated in place; cos, sin: [max_pos, D/2] fp32; positions: [N] int32/int64.
void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions);

// gate_up: [..., 2I] -> out: [..., I].
void silu_mul(at::Tensor& out, const at::Tensor& gate_up);

// q: [B, H, D]; k_cache, v_cache: [B, Hkv, S, D]; seq_lens: [B] int32; out: [B, H, D].
// partial_acc: [B, H, splits, D] fp32 and partial_ml: [B, H, splits, 2] fp32 are the split workspace,
// with splits * chunk >= S.
void decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& seq_lens, double scale, at::Tensor& partial_acc, at::Tensor& partial_ml,
                      int64_t chunk);

}  // namespace decodescope
