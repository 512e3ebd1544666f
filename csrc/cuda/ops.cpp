// Torch-facing host code for the norms, rope, silu, the weight-only GEMV and its dequantize route: check, pick
// the stream, dispatch the dtype, call a launcher from launchers.h.
// Compiled by the host compiler; the kernels live in kernels.cu.
#include "ops.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "checks.h"
#include "launchers.h"

namespace decodescope {

void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_cuda(x, "x", x);
  check_norm(x, weight, "x");
  check_cuda(out, "out", x);
  check_same(out, "out", x, "x");
  check_dense(out, "out");
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  const int hidden = checked_int(x.size(-1), "hidden");
  dispatch_float(x.scalar_type(), "x", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_rmsnorm<T>(ptr<T>(out), ptr<T>(x), ptr<T>(weight), rows_of(x, hidden), hidden,
                                   static_cast<float>(eps), stream),
                 "rmsnorm");
  });
}

void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_cuda(x, "x", x);
  check_norm(x, weight, "x");
  check_cuda(residual, "residual", x);
  check_same(residual, "residual", x, "x");
  check_dense(residual, "residual");
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  const int hidden = checked_int(x.size(-1), "hidden");
  dispatch_float(x.scalar_type(), "x", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_add_rmsnorm<T>(ptr<T>(x), ptr<T>(residual), ptr<T>(weight), rows_of(x, hidden), hidden,
                                       static_cast<float>(eps), stream),
                 "add_rmsnorm");
  });
}

void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions) {
  check_cuda(q, "q", q);
  check_cuda(k, "k", q);
  check_cuda(cos, "cos", q);
  check_cuda(sin, "sin", q);
  check_cuda(positions, "positions", q);
  TORCH_CHECK(q.dim() == 3, "q must be [N, H, D], got ", q.sizes());
  TORCH_CHECK(k.dim() == 3, "k must be [N, Hkv, D], got ", k.sizes());
  const int64_t n = q.size(0), d = q.size(2);
  TORCH_CHECK(k.size(0) == n && k.size(2) == d, "k must be [N, Hkv, D] = [", n, ", Hkv, ", d, "], got ", k.sizes());
  TORCH_CHECK(d > 0 && d % 2 == 0, "head_dim must be even, got D = ", d);
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), "k must have q's dtype ", q.scalar_type(), ", got ",
              k.scalar_type());
  check_dense_heads(q, "q");
  check_dense_heads(k, "k");
  TORCH_CHECK(cos.dim() == 2 && cos.size(1) == d / 2, "cos must be [max_pos, D/2] = [max_pos, ", d / 2, "], got ",
              cos.sizes());
  check_same(sin, "sin", cos, "cos");
  TORCH_CHECK(cos.scalar_type() == at::kFloat, "cos and sin must be float32, got ", cos.scalar_type());
  check_dense(cos, "cos");
  check_dense(sin, "sin");
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == n, "positions must be [N] = [", n, "], got ",
              positions.sizes());
  check_dense(positions, "positions");
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device());
  const int h = checked_int(q.size(1), "H"), hkv = checked_int(k.size(1), "Hkv");
  checked_int(n, "N");
  dispatch_float(q.scalar_type(), "q", [&](auto zero) {
    using T = decltype(zero);
    if (positions.scalar_type() == at::kInt) {
      check_launch(launch_rope<T, int32_t>(ptr<T>(q), ptr<T>(k), ptr<float>(cos), ptr<float>(sin),
                                           ptr<int32_t>(positions), n, h, hkv, static_cast<int>(d), q.stride(0),
                                           k.stride(0), cos.size(0), stream),
                   "rope");
    } else {
      TORCH_CHECK(positions.scalar_type() == at::kLong, "positions must be int32 or int64, got ",
                  positions.scalar_type());
      check_launch(launch_rope<T, int64_t>(ptr<T>(q), ptr<T>(k), ptr<float>(cos), ptr<float>(sin),
                                           ptr<int64_t>(positions), n, h, hkv, static_cast<int>(d), q.stride(0),
                                           k.stride(0), cos.size(0), stream),
                   "rope");
    }
  });
}

void silu_mul(at::Tensor& out, const at::Tensor& gate_up) {
  check_cuda(gate_up, "gate_up", gate_up);
  check_cuda(out, "out", gate_up);
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "gate_up must be [..., 2I], got ", gate_up.sizes());
  check_dense(gate_up, "gate_up");
  auto expected = gate_up.sizes().vec();
  expected.back() /= 2;
  TORCH_CHECK(out.sizes() == at::IntArrayRef(expected), "out must be [..., I] = ", at::IntArrayRef(expected),
              ", got ", out.sizes());
  TORCH_CHECK(out.scalar_type() == gate_up.scalar_type(), "out must have gate_up's dtype ",
              gate_up.scalar_type(), ", got ", out.scalar_type());
  check_dense(out, "out");
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(gate_up.get_device());
  const int inter = checked_int(expected.back(), "I");
  const int64_t rows = inter == 0 ? 0 : rows_of(out, inter);
  dispatch_float(gate_up.scalar_type(), "gate_up", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_silu_mul<T>(ptr<T>(out), ptr<T>(gate_up), rows, inter, stream), "silu_mul");
  });
}

// --- weight-only GEMV over GGUF blocks (gemv.cuh), and the blocks dequantized (dequantize.cuh) ------------

namespace {

// qs: [out, row_bytes] of qs_dtype holding in_pad = row_bytes * per_byte inputs (in rounded up to whole blocks of
// 32); d (and m): [out, in_pad / 32] fp16; all on ref's device.
void check_blocks(const at::Tensor& qs, const at::Tensor& d, const at::Tensor* m, int64_t in, at::ScalarType qs_dtype,
                  int per_byte, const at::Tensor& ref) {
  check_cuda(qs, "qs", ref);
  const int64_t rows = qs.size(0), in_pad = (in + 31) / 32 * 32;
  check_dtype(qs, "qs", qs_dtype);
  TORCH_CHECK(qs.dim() == 2 && qs.size(1) * per_byte == in_pad, "qs must be [out, ", in_pad / per_byte,
              "] for in = ", in, " (", in_pad, " inputs padded to whole blocks of 32), got ", qs.sizes());
  check_dense(qs, "qs");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(qs.data_ptr()) % 16 == 0, "qs must start 16-byte aligned");
  auto check_scales = [&](const at::Tensor& s, const char* name) {
    check_cuda(s, name, ref);
    check_dtype(s, name, at::kHalf);
    TORCH_CHECK(s.dim() == 2 && s.size(0) == rows && s.size(1) == in_pad / 32, name, " must be [out, in_pad / 32] = [",
                rows, ", ", in_pad / 32, "], got ", s.sizes());
    check_dense(s, name);
  };
  check_scales(d, "d");
  if (m != nullptr) check_scales(*m, "m");
}

// x: [T, in] (more than 16 tokens run as tiles of 16); w: the weight's rows [out, ...], checked by
// check_weight(in); out: [T, out] of x's dtype. Returns the launcher's arguments, the scales not set.
template <typename T, typename CheckWeight>
GemvArgs<T> gemv_args(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, CheckWeight&& check_weight) {
  TORCH_CHECK(x.dim() == 2, "x must be [T, in], got ", x.sizes());
  TORCH_CHECK(x.stride(1) == 1, "x's rows must be dense, got strides ", x.strides());
  check_cuda(out, "out", x);
  const int64_t t = x.size(0), in = x.size(1), rows = w.size(0);
  check_weight(in);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == t && out.size(1) == rows, "out must be [T, out] = [", t, ", ", rows,
              "], got ", out.sizes());
  check_dtype(out, "out", x.scalar_type());
  check_dense(out, "out");
  GemvArgs<T> a{};
  a.out = ptr<T>(out);
  a.x = ptr<T>(x);
  a.qs = w.data_ptr();
  a.tokens = checked_int(t, "T");
  a.in_features = checked_int(in, "in");
  a.out_features = checked_int(rows, "out");
  a.x_stride = x.stride(0);
  return a;
}

template <typename T>
GemvArgs<T> block_gemv_args(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d,
                            const at::Tensor* m, at::ScalarType qs_dtype, int per_byte) {
  GemvArgs<T> a = gemv_args<T>(out, x, qs, [&](int64_t in) { check_blocks(qs, d, m, in, qs_dtype, per_byte, x); });
  a.d = ptr<__half>(d);
  a.m = m == nullptr ? nullptr : ptr<__half>(*m);
  return a;
}

// w: [out, in] float16 or bfloat16, dense, 16-byte aligned, on x's device.
void check_dense_weight(const at::Tensor& w, int64_t in, const at::Tensor& x) {
  check_cuda(w, "w", x);
  TORCH_CHECK(w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16, "w must be float16 or bfloat16, got ",
              w.scalar_type());
  TORCH_CHECK(w.dim() == 2 && w.size(1) == in, "w must be [out, in] with in = ", in, ", got ", w.sizes());
  check_dense(w, "w");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 == 0, "w must start 16-byte aligned");
}

// out: [out, in] dense, float32 / float16 / bfloat16; the blocks as check_blocks for that `in`.
template <typename T>
DequantizeArgs<T> dequantize_args(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d, const at::Tensor* m,
                                  at::ScalarType qs_dtype, int per_byte) {
  TORCH_CHECK(out.dim() == 2 && out.size(1) > 0, "out must be [out, in] with in > 0, got ", out.sizes());
  check_blocks(qs, d, m, out.size(1), qs_dtype, per_byte, out);
  TORCH_CHECK(out.size(0) == qs.size(0), "out must be [out, in] = [", qs.size(0), ", ", out.size(1), "], got ",
              out.sizes());
  check_dense(out, "out");
  DequantizeArgs<T> a{};
  a.out = ptr<T>(out);
  a.qs = qs.data_ptr();
  a.d = ptr<__half>(d);
  a.m = m == nullptr ? nullptr : ptr<__half>(*m);
  a.out_features = checked_int(out.size(0), "out");
  a.in_features = checked_int(out.size(1), "in");
  a.out_stride = out.stride(0);
  return a;
}

}  // namespace

void linear_int8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d) {
  check_cuda(x, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  dispatch_float(x.scalar_type(), "x", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_linear_int8<T>(block_gemv_args<T>(out, x, qs, d, nullptr, at::kChar, 1), stream), "linear_int8");
  });
}

void linear_q4(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m) {
  check_cuda(x, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  dispatch_float(x.scalar_type(), "x", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_linear_q4<T>(block_gemv_args<T>(out, x, qs, d, &m, at::kByte, 2), stream), "linear_q4");
  });
}

void linear_dense(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  check_cuda(x, "x", x);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.get_device());
  dispatch_float(x.scalar_type(), "x", [&](auto zero) {
    using T = decltype(zero);
    const GemvArgs<T> a = gemv_args<T>(out, x, w, [&](int64_t in) { check_dense_weight(w, in, x); });
    check_launch(w.scalar_type() == at::kHalf ? launch_linear_fp16<T>(a, stream) : launch_linear_bf16<T>(a, stream),
                 "linear_dense");
  });
}

void dequantize_int8(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d) {
  check_cuda(out, "out", out);
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.get_device());
  dispatch_float(out.scalar_type(), "out", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_dequantize_int8<T>(dequantize_args<T>(out, qs, d, nullptr, at::kChar, 1), stream),
                 "dequantize_int8");
  });
}

void dequantize_q4(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m) {
  check_cuda(out, "out", out);
  const c10::cuda::CUDAGuard guard(out.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.get_device());
  dispatch_float(out.scalar_type(), "out", [&](auto zero) {
    using T = decltype(zero);
    check_launch(launch_dequantize_q4<T>(dequantize_args<T>(out, qs, d, &m, at::kByte, 2), stream),
                 "dequantize_q4");
  });
}

}  // namespace decodescope
