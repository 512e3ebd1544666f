// Every weight format, once. The CPU module's Format codes and records (cpu/kernels.h, cpu/formats.h) and the CUDA
// GEMV's Format (cuda/blocks.cuh) are generated from this list, and each module reports its rows back
// (`format_facts()`), which engine/ops/__init__.py checks against engine/weights' records whenever it builds an
// OpSet: a format added or changed on one side only is refused at load, naming the difference.
// Plain C++17 (nvcc, the host compilers and the CUDA emulation all include it).
//
// X(name, bits, block, cpu, cpu_code, activations, cuda)
//   name         engine/weights' record (WeightFormat.name)
//   bits         per weight, block scales and mins included (WeightFormat.bits); the CPU thread split's cost
//   block        inputs per quantization block, 1 for a dense format (WeightFormat.block)
//   cpu          yes: a CPU kernel runs it, under the code cpu_code (its tile: cpu/gemm.h Gemm::linears; its
//                packed tensors: cpu/formats.h packed_tensors); no: its twin runs on a CPU (cpu_code unused)
//   activations  what the CPU kernel and its twin do with x (WeightFormat.cpu_activations): exact, int8, int16, q8_k
//   cuda         gemv: the CUDA GEMV reads its blocks (blocks::Format::<name>); int8, q4: that format's GEMV reads
//                them (the same blocks); no: no CUDA kernel reads it (fp32 runs on cuBLAS, the rest on their twins)
#pragma once

#define DECODESCOPE_FORMATS(X)                       \
  X(fp32, 32.0, 1, yes, kFp32, exact, no)            \
  X(fp16, 16.0, 1, yes, kFp16, exact, gemv)          \
  X(bf16, 16.0, 1, yes, kBf16, exact, gemv)          \
  X(int8, 8.5, 32, yes, kInt8, int8, gemv)           \
  X(q8, 8.5, 32, yes, kQ8, int16, int8)              \
  X(q4, 5.0, 32, yes, kQ4, int16, gemv)              \
  X(q4_a8, 5.0, 32, yes, kQ4A8, int8, q4)            \
  X(q4_k, 4.5, 256, yes, kQ4K, q8_k, no)             \
  X(q5_k, 5.5, 256, yes, kQ5K, q8_k, no)             \
  X(q6_k, 6.5625, 256, yes, kQ6K, q8_k, no)          \
  X(q4_0, 4.5, 32, yes, kQ4_0, int8, no)             \
  X(q5_0, 5.5, 32, yes, kQ5_0, int8, no)            \
  X(q5_1, 6.0, 32, yes, kQ5_1, int8, no)            \
  X(q3_k, 3.4375, 256, yes, kQ3K, q8_k, no)         \
  X(q2_k, 2.625, 256, yes, kQ2K, q8_k, no)

// The rows a column selects: DECODESCOPE_<column>_<value>(text) is the text where the value selects the row, else
// nothing. CPU: the CPU kernels run it; CUDA_GEMV: a GEMV of its own (blocks::Format); CUDA: a CUDA kernel reads it.
#define DECODESCOPE_CPU_yes(...) __VA_ARGS__
#define DECODESCOPE_CPU_no(...)
#define DECODESCOPE_CUDA_GEMV_gemv(...) __VA_ARGS__
#define DECODESCOPE_CUDA_GEMV_int8(...)
#define DECODESCOPE_CUDA_GEMV_q4(...)
#define DECODESCOPE_CUDA_GEMV_no(...)
#define DECODESCOPE_CUDA_gemv(...) __VA_ARGS__
#define DECODESCOPE_CUDA_int8(...) __VA_ARGS__
#define DECODESCOPE_CUDA_q4(...) __VA_ARGS__
#define DECODESCOPE_CUDA_no(...)

namespace decodescope {

// A row as the modules report it (format_facts()).
struct FormatFacts {
  const char* name;
  double bits;
  int block;
  const char* cpu_activations;
};

#define DECODESCOPE_FACTS(name_, bits_, block_, cpu_, code_, activations_, cuda_) \
  FormatFacts{#name_, bits_, block_, #activations_},
// The CPU kernels' rows in Format code order, and the rows a CUDA kernel reads.
inline constexpr FormatFacts kCpuFormatFacts[] = {
#define DECODESCOPE_CPU_FACTS(name_, bits_, block_, cpu_, ...) \
  DECODESCOPE_CPU_##cpu_(DECODESCOPE_FACTS(name_, bits_, block_, cpu_, __VA_ARGS__))
    DECODESCOPE_FORMATS(DECODESCOPE_CPU_FACTS)
#undef DECODESCOPE_CPU_FACTS
};
inline constexpr FormatFacts kCudaFormatFacts[] = {
#define DECODESCOPE_CUDA_FACTS(name_, bits_, block_, cpu_, code_, activations_, cuda_) \
  DECODESCOPE_CUDA_##cuda_(DECODESCOPE_FACTS(name_, bits_, block_, cpu_, code_, activations_, cuda_))
    DECODESCOPE_FORMATS(DECODESCOPE_CUDA_FACTS)
#undef DECODESCOPE_CUDA_FACTS
};
#undef DECODESCOPE_FACTS

}  // namespace decodescope
