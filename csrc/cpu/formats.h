// The host side of each weight format the CPU kernels run: one record per Format (kernels.h), generated from the
// list of formats (../format_list.h) and named as engine/weights' records are, read by the one linear() (ops_linear.cpp) and the block loop (ops_blocks.cpp).
// A record says what the format's packed tensors look like (checked before a kernel reads them) and what its
// kernel needs of the activations; the kernel itself is KernelTable::linear[format] (gemm.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "kernels.h"

namespace decodescope::cpu {

// What a format's kernel reads instead of x itself (LinearArgs says where each goes); the names are
// WeightFormat.cpu_activations', as the list (../format_list.h) spells them.
enum class Activations {
  exact,  // x [T, in] as given
  int8,   // quantized to int8 per block of 32 (qx, dx, qoff: quantize_rows)
  int16,  // quantized to 16 bits per block of 32 (Act16: quantize_rows16)
  q8_k,   // quantized to int8 per super-block of 256, with the sums of every 16 (qx, dx, xpair: quantize_rows_k)
};

// A packed tensor's expected shape, symbolic in P (panels of 16 outputs), nb (blocks of 32 inputs), in and ns
// (super-blocks of 256 inputs): a negative dim is one of those letters.
constexpr int64_t kP = -1, kNb = -2, kIn = -3, kNs = -4;
struct TensorSpec {
  const char* name;
  at::ScalarType dtype;
  const char* letters;  // the shape in letters, for messages: "[P, nb, 16, 16]"
  int rank;
  std::array<int64_t, 5> dims;
};

// The tensors a format's panels are (engine/weights' "cpu" layout packs them): the weight values (q4: with its
// scales and mins), then scales.
struct PackedTensors {
  int n_tensors;
  std::array<TensorSpec, 2> tensors;
};

constexpr std::array<PackedTensors, kNumFormats> packed_tensors() {
  std::array<PackedTensors, kNumFormats> t{};
  t[kFp32] = {1, {{{.name = "w", .dtype = at::kFloat, .letters = "[P, in, 16]", .rank = 3, .dims = {kP, kIn, 16}}}}};
  t[kFp16] = {1, {{{.name = "w", .dtype = at::kHalf, .letters = "[P, in, 16]", .rank = 3, .dims = {kP, kIn, 16}}}}};
  t[kBf16] = {1, {{{.name = "w", .dtype = at::kBFloat16, .letters = "[P, in, 16]", .rank = 3,
                    .dims = {kP, kIn, 16}}}}};
  constexpr TensorSpec qs{.name = "qs", .dtype = at::kByte, .letters = "[P, nb, 8, 16, 4]", .rank = 5,
                          .dims = {kP, kNb, 8, 16, 4}};
  constexpr TensorSpec d{.name = "d", .dtype = at::kHalf, .letters = "[P, nb, 16]", .rank = 3, .dims = {kP, kNb, 16}};
  t[kInt8] = {2, {{qs, d}}};
  t[kQ8] = {2, {{qs, d}}};
  t[kQ4] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 320]", .rank = 3,
                  .dims = {kP, kNb, kQ4BlockBytes}}}}};
  t[kQ4A8] = t[kQ4];  // the same stream
  t[kQ4K] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 2304]", .rank = 3,
                   .dims = {kP, kNs, kQ4KBytes}}}}};
  t[kQ5K] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 2816]", .rank = 3,
                   .dims = {kP, kNs, kQ5KBytes}}}}};
  t[kQ6K] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 3360]", .rank = 3,
                   .dims = {kP, kNs, kQ6KBytes}}}}};
  t[kQ2K] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 1344]", .rank = 3,
                   .dims = {kP, kNs, kQ2KBytes}}}}};
  t[kQ3K] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 1760]", .rank = 3,
                   .dims = {kP, kNs, kQ3KBytes}}}}};
  t[kQ4_0] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 288]", .rank = 3,
                    .dims = {kP, kNb, kQ4_0Bytes}}}}};
  t[kQ5_0] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 352]", .rank = 3,
                    .dims = {kP, kNb, kQ5_0Bytes}}}}};
  t[kQ5_1] = {1, {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 384]", .rank = 3,
                    .dims = {kP, kNb, kQ5_1Bytes}}}}};
  return t;
}
inline constexpr std::array<PackedTensors, kNumFormats> kPackedTensors = packed_tensors();

struct FormatRecord {
  Format format;
  const char* name;  // engine/weights' record name
  Activations activations;
  double bits;  // per weight, scales included
  int n_tensors;  // packed tensors after x (kPackedTensors)
  std::array<TensorSpec, 2> tensors;
  // weight bytes one panel of 16 outputs streams per input: the thread split's cost
  constexpr double bytes_per_input() const { return kPanel * bits / 8; }
};

// One record per row of ../format_list.h that a CPU kernel runs, in code order.
#define DECODESCOPE_CPU_RECORD(name_, bits_, block_, cpu_, code_, activations_, cuda_)                             \
  DECODESCOPE_CPU_##cpu_(FormatRecord{.format = code_, .name = #name_, .activations = Activations::activations_, \
                                      .bits = bits_, .n_tensors = kPackedTensors[code_].n_tensors,                 \
                                      .tensors = kPackedTensors[code_].tensors}, )
inline constexpr std::array<FormatRecord, kNumFormats> kFormats{{DECODESCOPE_FORMATS(DECODESCOPE_CPU_RECORD)}};
#undef DECODESCOPE_CPU_RECORD

// The record of a format code, checked (ops_linear.cpp): an unknown code is an error naming the known ones.
const FormatRecord& format_record(int64_t format);

constexpr bool records_complete() {
  for (int i = 0; i < kNumFormats; ++i)
    if (kFormats[i].format != i || kFormats[i].n_tensors == 0) return false;
  return true;
}
static_assert(records_complete(), "every CPU format needs its packed tensors in packed_tensors()");

}  // namespace decodescope::cpu
