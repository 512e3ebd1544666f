// Torch-facing host code for the panel GEMMs (kernels in gemm.h): check, prepare the activations a
// format needs, split the panels across threads, call the table's kernel.
#include <ATen/record_function.h>

#include <vector>

#include "checks.h"
#include "isa.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

struct Shape {
  int64_t rows, in, n_out, panels, nb;
};

// x: [T, in], out: [T, n_out], both fp32, contiguous, not overlapping.
Shape check_linear(const at::Tensor& out, const at::Tensor& x) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [T, in], got ", x.sizes());
  check_dtype(x, "x", at::kFloat);
  check_dense(x, "x");
  check_cpu(out, "out");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0), "out must be [T, out] with T = ", x.size(0), ", got ",
              out.sizes());
  check_dtype(out, "out", at::kFloat);
  check_dense(out, "out");
  TORCH_CHECK(!overlaps(out, x), "out must not overlap x (the kernel reads x after it starts writing out)");
  Shape s{x.size(0), x.size(1), out.size(1), (out.size(1) + kPanel - 1) / kPanel, (x.size(1) + kBlock - 1) / kBlock};
  checked_int(s.rows, "T");
  checked_int(s.n_out, "out features");
  checked_int(s.in, "in features");
  return s;
}

LinearArgs base_args(at::Tensor& out, const at::Tensor& x, const Shape& s) {
  LinearArgs a{};
  a.y = out.data_ptr<float>();
  a.ldy = s.n_out;
  a.x = x.data_ptr<float>();
  a.ldx = s.in;
  a.rows = static_cast<int>(s.rows);
  a.in = static_cast<int>(s.in);
  a.n_out = static_cast<int>(s.n_out);
  a.nb = static_cast<int>(s.nb);
  return a;
}

// A chunk of panels handed to another thread should stream at least this many weight bytes: less and
// the handoff costs more than the chunk.
constexpr int64_t kMinChunkBytes = 32 << 10;

void run(LinearFn fn, const LinearArgs& a, const Shape& s, int64_t panel_bytes) {
  const int64_t min_chunk = (kMinChunkBytes + panel_bytes - 1) / panel_bytes;
  parallel_chunks(s.panels, min_chunk, [&](int64_t p0, int64_t p1) { fn(a, p0, p1); });
}

// Activations prepared per call, reused across calls of the calling thread.
struct Scratch {
  std::vector<float> x, xsum, dx;
  std::vector<int8_t> qx;
  std::vector<int32_t> qoff;
};
thread_local Scratch scratch;

// The q4 and q8 kernels read whole blocks of x, so a ragged `in` is zero-padded here.
void pad_blocks(LinearArgs& a, const Shape& s) {
  const int64_t width = s.nb * kBlock;
  if (width == s.in) return;
  scratch.x.assign(s.rows * width, 0.f);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t i = 0; i < s.in; ++i) scratch.x[r * width + i] = a.x[r * s.in + i];
  a.x = scratch.x.data();
  a.ldx = width;
}

}  // namespace

void linear_f32(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  RECORD_FUNCTION("decodescope::linear_f32", std::vector<c10::IValue>({x, w}));
  const Shape s = check_linear(out, x);
  check_tensor(w, "w", at::kFloat, "[P, in, 16]", {s.panels, s.in, kPanel});
  if (s.rows == 0 || s.n_out == 0) return;
  LinearArgs a = base_args(out, x, s);
  a.w = w.data_ptr();
  run(kernels().linear_f32, a, s, s.in * kPanel * 4);
}

void linear_f16(at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  RECORD_FUNCTION("decodescope::linear_f16", std::vector<c10::IValue>({x, w}));
  const Shape s = check_linear(out, x);
  check_tensor(w, "w", at::kHalf, "[P, in, 16]", {s.panels, s.in, kPanel});
  if (s.rows == 0 || s.n_out == 0) return;
  LinearArgs a = base_args(out, x, s);
  a.w = w.data_ptr();
  run(kernels().linear_f16, a, s, s.in * kPanel * 2);
}

void linear_int8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d) {
  RECORD_FUNCTION("decodescope::linear_int8", std::vector<c10::IValue>({x, qs, d}));
  const Shape s = check_linear(out, x);
  check_tensor(qs, "qs", at::kByte, "[P, nb, 8, 16, 4]", {s.panels, s.nb, kBlock / 4, kPanel, 4});
  check_tensor(d, "d", at::kHalf, "[P, nb, 16]", {s.panels, s.nb, kPanel});
  if (s.rows == 0 || s.n_out == 0) return;
  LinearArgs a = base_args(out, x, s);
  // The activations are quantized once here, not per thread: T * in values against out * in weights.
  scratch.qx.resize(s.rows * s.nb * kBlock);
  scratch.dx.resize(s.rows * s.nb);
  scratch.qoff.resize(s.rows * s.nb);
  kernels().quantize_rows(a.x, a.ldx, a.in, a.nb, scratch.qx.data(), scratch.dx.data(), scratch.qoff.data(), 0,
                          s.rows);
  a.qx = scratch.qx.data();
  a.dx = scratch.dx.data();
  a.qoff = scratch.qoff.data();
  a.w = qs.data_ptr();
  a.d = reinterpret_cast<const uint16_t*>(d.data_ptr());
  run(kernels().linear_int8, a, s, s.nb * (kBlock * kPanel + 2 * kPanel));
}

void linear_q8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d) {
  RECORD_FUNCTION("decodescope::linear_q8", std::vector<c10::IValue>({x, qs, d}));
  const Shape s = check_linear(out, x);
  check_tensor(qs, "qs", at::kByte, "[P, nb, 8, 16, 4]", {s.panels, s.nb, kBlock / 4, kPanel, 4});
  check_tensor(d, "d", at::kHalf, "[P, nb, 16]", {s.panels, s.nb, kPanel});
  if (s.rows == 0 || s.n_out == 0) return;
  LinearArgs a = base_args(out, x, s);
  pad_blocks(a, s);
  a.w = qs.data_ptr();
  a.d = reinterpret_cast<const uint16_t*>(d.data_ptr());
  run(kernels().linear_q8, a, s, s.nb * (kBlock * kPanel + 2 * kPanel));
}

void linear_q4(at::Tensor& out, const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m) {
  RECORD_FUNCTION("decodescope::linear_q4", std::vector<c10::IValue>({x, qs, d, m}));
  const Shape s = check_linear(out, x);
  check_tensor(qs, "qs", at::kByte, "[P, nb, 16, 16]", {s.panels, s.nb, kBlock / 2, kPanel});
  check_tensor(d, "d", at::kHalf, "[P, nb, 16]", {s.panels, s.nb, kPanel});
  check_tensor(m, "m", at::kHalf, "[P, nb, 16]", {s.panels, s.nb, kPanel});
  if (s.rows == 0 || s.n_out == 0) return;
  LinearArgs a = base_args(out, x, s);
  pad_blocks(a, s);
  // each block's sum of x carries the mins' term (m * sum x) out of the inner loop
  scratch.xsum.resize(s.rows * s.nb);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t b = 0; b < s.nb; ++b) {
      float sum = 0.f;
      for (int i = 0; i < kBlock; ++i) sum += a.x[r * a.ldx + b * kBlock + i];
      scratch.xsum[r * s.nb + b] = sum;
    }
  }
  a.xsum = scratch.xsum.data();
  a.w = qs.data_ptr();
  a.d = reinterpret_cast<const uint16_t*>(d.data_ptr());
  a.m = reinterpret_cast<const uint16_t*>(m.data_ptr());
  run(kernels().linear_q4, a, s, s.nb * (kBlock / 2 * kPanel + 4 * kPanel));
}

}  // namespace decodescope::cpu
