// Torch-facing host code for the panel GEMMs (kernels in gemm.h), one function for every format: check the
// packed tensors against the format's record (formats.h), prepare the activations its kernel needs, split
// the panels across threads, call the table's kernel.
#include <ATen/record_function.h>

#include <string>
#include <vector>

#include "checks.h"
#include "formats.h"
#include "greedy.h"
#include "isa.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

struct Shape {
  int64_t rows, in, n_out, panels, nb, ns;
};

// x: [T, in] contiguous, out: [T, n_out] with dense rows (a slice of a wider output's columns), both fp32, not
// overlapping.
Shape check_linear(const at::Tensor& out, const at::Tensor& x) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [T, in], got ", x.sizes());
  check_dtype(x, "x", at::kFloat);
  check_dense(x, "x");
  check_cpu(out, "out");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0), "out must be [T, out] with T = ", x.size(0), ", got ",
              out.sizes());
  check_dtype(out, "out", at::kFloat);
  TORCH_CHECK((out.size(1) <= 1 || out.stride(1) == 1) && (out.size(0) <= 1 || out.stride(0) >= out.size(1)),
              "out's rows must be dense and apart (strides [>= ", out.size(1), ", 1]), got strides ", out.strides());
  TORCH_CHECK(!overlaps(out, x), "out must not overlap x (the kernel reads x after it starts writing out)");
  Shape s{x.size(0), x.size(1), out.size(1), (out.size(1) + kPanel - 1) / kPanel, (x.size(1) + kBlock - 1) / kBlock,
          (x.size(1) + kSuper - 1) / kSuper};
  checked_int(s.rows, "T");
  checked_int(s.n_out, "out features");
  checked_int(s.in, "in features");
  return s;
}

void check_weights(const FormatRecord& f, const Shape& s, const at::Tensor* w) {
  for (int j = 0; j < f.n_tensors; ++j) {
    const TensorSpec& spec = f.tensors[j];
    std::vector<int64_t> shape(spec.dims.begin(), spec.dims.begin() + spec.rank);
    for (int64_t& d : shape) d = d == kP ? s.panels : d == kNb ? s.nb : d == kIn ? s.in : d == kNs ? s.ns : d;
    check_tensor(w[j], spec.name, spec.dtype, spec.letters, shape);
  }
}

// A chunk of panels handed to another thread should stream at least this many weight bytes: less and
// the handoff costs more than the chunk.
constexpr int64_t kMinChunkBytes = 32 << 10;

// Activations prepared per call, reused across calls of the calling thread.
struct Scratch {
  std::vector<float> dx, xs, fold;
  std::vector<int8_t> qx, hi;
  std::vector<uint8_t> lo;
  std::vector<int16_t> xp;
  std::vector<int32_t> qoff, sum16, shi, xpair;
  Act16 act;
};
thread_local Scratch scratch;

// The activations quantized once here, not per thread: T * in values against out * in weights.
void quantize_int8(LinearArgs& a, const Shape& s) {
  Scratch& sc = scratch;
  sc.qx.resize(s.rows * s.nb * kBlock);
  sc.dx.resize(s.rows * s.nb);
  sc.qoff.resize(s.rows * s.nb);
  kernels().quantize_rows(a.x, a.ldx, a.in, a.nb, sc.qx.data(), sc.dx.data(), sc.qoff.data(), 0, s.rows);
  a.qx = sc.qx.data();
  a.dx = sc.dx.data();
  a.qoff = sc.qoff.data();
}

// q4_a8's and q5_1's fold factors (fold_q4's dx and xs) per block and row, once per call rather than in every
// panel's tile, and block-major so that a tile reads its rows' at one pointer.
// The scratch's address is looked up once here and in the functions around: a thread_local in a shared library is a
// call per use (__tls_get_addr), which in this loop took more of a 6-row call's time than its quantization did.
void fold_factors(LinearArgs& a, const Shape& s) {
  std::vector<float>& fold = scratch.fold;
  fold.resize(2 * s.rows * s.nb);
  float* f = fold.data();
  for (int64_t b = 0; b < s.nb; ++b)
    for (int64_t r = 0; r < s.rows; ++r, f += 2) {
      const int64_t i = r * s.nb + b;
      f[0] = a.dx[i];
      f[1] = a.dx[i] * static_cast<float>(-(a.qoff[i] / 128));  // the block's sum of qx: |sum| <= 32 * 127, exact
    }
  a.fold = fold.data();
}

// Q8_K: int8 per super-block of 256 and the sums of every 16 paired, once here as quantize_int8.
void quantize_q8k(LinearArgs& a, const Shape& s) {
  Scratch& sc = scratch;
  sc.qx.resize(s.rows * s.ns * kSuper);
  sc.dx.resize(s.rows * s.ns);
  sc.xpair.resize(s.rows * s.ns * kXPairs);
  kernels().quantize_rows_k(a.x, a.ldx, a.in, static_cast<int>(s.ns), sc.qx.data(), sc.dx.data(), sc.xpair.data(), 0,
                            s.rows);
  a.qx = sc.qx.data();
  a.dx = sc.dx.data();
  a.xpair = sc.xpair.data();
}

// The 16-bit activations (kernels.h Act16), every plane and kAct16PadRows rows past T allocated: the ISA's prep
// writes the ones its kernels read, and an AMX tile may read (never fold) the padding rows.
void quantize_int16(LinearArgs& a, const Shape& s) {
  const int64_t rows = s.rows + kAct16PadRows, ld = s.nb * kBlock;
  Scratch& sc = scratch;
  sc.hi.resize(rows * ld);
  sc.lo.resize(rows * ld);
  sc.xp.resize(rows * ld);
  for (auto* v : {&sc.dx, &sc.xs}) v->resize(rows * s.nb);
  for (auto* v : {&sc.sum16, &sc.shi}) v->resize(rows * s.nb);
  Act16& act = sc.act;
  act = {.ld = ld, .hi = sc.hi.data(), .lo = sc.lo.data(), .xp = sc.xp.data(), .dx = sc.dx.data(), .xs = sc.xs.data(),
         .sum16 = sc.sum16.data(), .shi = sc.shi.data()};
  kernels().quantize_rows16(a.x, a.ldx, a.in, a.nb, act, 0, s.rows);
  a.act = &act;
}

// "decodescope::linear_<format>": what torch.profiler shows (engine/observe/breakdown.py classes it as matmul).
const std::string& scope_name(int64_t format) {
  static const std::array<std::string, kNumFormats> names = [] {
    std::array<std::string, kNumFormats> n;
    for (int i = 0; i < kNumFormats; ++i) n[i] = std::string("decodescope::linear_") + kFormats[i].name;
    return n;
  }();
  return names[format];
}

}  // namespace

const FormatRecord& format_record(int64_t format) {
  TORCH_CHECK(format >= 0 && format < kNumFormats, "unknown weight format code ", format, " (0..", kNumFormats - 1,
              ": ", format_names(), ")");
  TORCH_CHECK(kernels().linear[format] != nullptr, kFormats[format].name, " has no kernel in the ", kernels().name,
              " table: its line in csrc/cpu/gemm.h Gemm::linears is missing");
  return kFormats[format];
}

std::vector<std::string> format_names() {
  std::vector<std::string> names;
  for (const FormatRecord& f : kFormats) names.emplace_back(f.name);
  return names;
}

namespace {

// linear, and with picks linear_greedy: the head's matmul in units of kGreedyUnit outputs (greedy.h), each unit
// reduced right after the kernel wrote it. A unit is 64 panels; the software prefetch runs on across units.
void run_linear(at::Tensor& out, const at::Tensor& x, int64_t format, const std::vector<at::Tensor>& tensors,
                std::vector<GreedyPick>* picks) {
  const FormatRecord& f = format_record(format);
  TORCH_CHECK(static_cast<int>(tensors.size()) == f.n_tensors, f.name, " weights are ", f.n_tensors,
              " packed tensor(s), got ", tensors.size());
  RECORD_FUNCTION(scope_name(format), std::vector<c10::IValue>({x}));
  const Shape s = check_linear(out, x);
  const at::Tensor* w = tensors.data();
  check_weights(f, s, w);
  TORCH_CHECK(!picks || out.is_contiguous(), "out must be a dense [T, out] for its rows' picks, got strides ",
              out.strides());
  if (s.rows == 0 || s.n_out == 0) return;
  if (s.in == 0) {  // an empty sum: nothing to read, and nothing for the per-block prologues to divide
    out.zero_();
    if (picks) *picks = greedy(out);
    return;
  }
  LinearArgs a{};
  a.y = out.data_ptr<float>();
  a.ldy = out.stride(0);
  a.x = x.data_ptr<float>();
  a.ldx = s.in;
  a.rows = static_cast<int>(s.rows);
  a.in = static_cast<int>(s.in);
  a.n_out = static_cast<int>(s.n_out);
  a.nb = static_cast<int>(s.nb);
  switch (f.activations) {
    case Activations::exact: break;
    case Activations::int8:
      quantize_int8(a, s);
      if (format == kQ4A8 || format == kQ5_1) fold_factors(a, s);
      break;
    case Activations::int16: quantize_int16(a, s); break;
    case Activations::q8_k: quantize_q8k(a, s); break;
  }
  a.w = w[0].data_ptr();
  if (f.n_tensors > 1) a.d = reinterpret_cast<const uint16_t*>(w[1].data_ptr());
  const double in_streamed = f.activations == Activations::exact ? s.in
                             : f.activations == Activations::q8_k ? s.ns * kSuper
                                                                  : s.nb * kBlock;
  const int64_t panel_bytes = static_cast<int64_t>(in_streamed * f.bytes_per_input()) + 1;
  const int64_t min_chunk = (kMinChunkBytes + panel_bytes - 1) / panel_bytes;
  const LinearFn fn = kernels().linear[format];
  if (!picks) return parallel_chunks(s.panels, min_chunk, [&](int64_t p0, int64_t p1) { fn(a, p0, p1); });

  constexpr int64_t kUnitPanels = kGreedyUnit / kPanel;
  const int64_t units = greedy_units(s.n_out);
  std::vector<GreedyUnit> u(s.rows * units);
  parallel_chunks(units, (min_chunk + kUnitPanels - 1) / kUnitPanels, [&](int64_t u0, int64_t u1) {
    for (int64_t j = u0; j < u1; ++j) {
      const int64_t p0 = j * kUnitPanels;
      fn(a, p0, p0 + kUnitPanels < s.panels ? p0 + kUnitPanels : s.panels);
      for (int64_t r = 0; r < s.rows; ++r) u[r * units + j] = greedy_unit(a.y + r * a.ldy, s.n_out, j);
    }
  });
  *picks = greedy_folds(u, a.y, a.ldy, s.rows, s.n_out);
}

}  // namespace

void linear_packed(at::Tensor& out, const at::Tensor& x, int64_t format, const std::vector<at::Tensor>& w) {
  run_linear(out, x, format, w, nullptr);
}

std::vector<GreedyPick> linear_greedy(at::Tensor& out, const at::Tensor& x, int64_t format,
                                      const std::vector<at::Tensor>& w) {
  std::vector<GreedyPick> picks;
  run_linear(out, x, format, w, &picks);
  return picks;
}

}  // namespace decodescope::cpu
