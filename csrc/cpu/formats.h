// The host side of each weight format the CPU kernels run: one record per Format (kernels.h), named as
// engine/weights' records are, read by the one linear() (ops_linear.cpp) and the block loop (ops_blocks.cpp).
// A record says what the format's packed tensors look like (checked before a kernel reads them) and what its
// kernel needs of the activations; the kernel itself is KernelTable::linear[format] (gemm.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "kernels.h"

namespace decodescope::cpu {

// What a format's kernel reads instead of x itself (LinearArgs says where each goes).
enum class Activations {
  kAsIs,   // x [T, in] as given
  kInt8,   // quantized to int8 per block of 32 (qx, dx, qoff: quantize_rows)
  kInt16,  // quantized to 16 bits per block of 32 (Act16: quantize_rows16)
  kQ8K,    // quantized to int8 per super-block of 256, with the sums of every 16 (qx, dx, xsum: quantize_rows_k)
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

struct FormatRecord {
  Format format;
  const char* name;  // engine/weights' record name
  Activations activations;
  int n_tensors;  // packed tensors after x: the weight values (q4: with its scales and mins), then scales
  std::array<TensorSpec, 2> tensors;
  double bytes_per_input;  // weight bytes one panel streams per input (scales included): the thread split's cost
};

inline constexpr std::array<FormatRecord, kNumFormats> kFormats{{
    {.format = kFp32, .name = "fp32", .activations = Activations::kAsIs, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kFloat, .letters = "[P, in, 16]", .rank = 3, .dims = {kP, kIn, 16}}}},
     .bytes_per_input = 16 * 4},
    {.format = kFp16, .name = "fp16", .activations = Activations::kAsIs, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kHalf, .letters = "[P, in, 16]", .rank = 3, .dims = {kP, kIn, 16}}}},
     .bytes_per_input = 16 * 2},
    {.format = kInt8, .name = "int8", .activations = Activations::kInt8, .n_tensors = 2,
     .tensors = {{{.name = "qs", .dtype = at::kByte, .letters = "[P, nb, 8, 16, 4]", .rank = 5,
                   .dims = {kP, kNb, 8, 16, 4}},
                  {.name = "d", .dtype = at::kHalf, .letters = "[P, nb, 16]", .rank = 3, .dims = {kP, kNb, 16}}}},
     .bytes_per_input = 16 * (1 + 2.0 / kBlock)},
    {.format = kQ8, .name = "q8", .activations = Activations::kInt16, .n_tensors = 2,
     .tensors = {{{.name = "qs", .dtype = at::kByte, .letters = "[P, nb, 8, 16, 4]", .rank = 5,
                   .dims = {kP, kNb, 8, 16, 4}},
                  {.name = "d", .dtype = at::kHalf, .letters = "[P, nb, 16]", .rank = 3, .dims = {kP, kNb, 16}}}},
     .bytes_per_input = 16 * (1 + 2.0 / kBlock)},
    {.format = kQ4, .name = "q4", .activations = Activations::kInt16, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 320]", .rank = 3,
                   .dims = {kP, kNb, kQ4BlockBytes}}}},
     .bytes_per_input = 16 * (0.5 + 4.0 / kBlock)},
    {.format = kQ4K, .name = "q4_k", .activations = Activations::kQ8K, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 2304]", .rank = 3,
                   .dims = {kP, kNs, kQ4KBytes}}}},
     .bytes_per_input = 16 * 4.5 / 8},
    {.format = kQ5K, .name = "q5_k", .activations = Activations::kQ8K, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 2816]", .rank = 3,
                   .dims = {kP, kNs, kQ5KBytes}}}},
     .bytes_per_input = 16 * 5.5 / 8},
    {.format = kQ6K, .name = "q6_k", .activations = Activations::kQ8K, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, ns, 3360]", .rank = 3,
                   .dims = {kP, kNs, kQ6KBytes}}}},
     .bytes_per_input = 16 * 6.5625 / 8},
    {.format = kQ4_0, .name = "q4_0", .activations = Activations::kInt8, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 288]", .rank = 3,
                   .dims = {kP, kNb, kQ4_0Bytes}}}},
     .bytes_per_input = 16 * 4.5 / 8},
    {.format = kQ5_0, .name = "q5_0", .activations = Activations::kInt8, .n_tensors = 1,
     .tensors = {{{.name = "w", .dtype = at::kByte, .letters = "[P, nb, 352]", .rank = 3,
                   .dims = {kP, kNb, kQ5_0Bytes}}}},
     .bytes_per_input = 16 * 5.5 / 8},
}};

// The record of a format code, checked (ops_linear.cpp): an unknown code is an error naming the known ones.
const FormatRecord& format_record(int64_t format);

constexpr bool records_in_code_order() {
  for (int i = 0; i < kNumFormats; ++i)
    if (kFormats[i].format != i) return false;
  return true;
}
static_assert(records_in_code_order(), "kFormats must list the records in Format order");

}  // namespace decodescope::cpu
