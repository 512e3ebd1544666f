// The GGUF block formats as the CUDA kernels read them (gemv.cuh, dequantize.cuh): a weight row is whole blocks
// of 32 inputs, int8 (Q8_0) one byte per input, q4 (Q4_1) two nibbles a byte; each block has an fp16 scale d
// (and, for q4, a min m): w = d * q (+ m). Both kernels read a row 16 bytes at a time: 16 int8 inputs or 32 q4
// inputs (one whole block) per load.
#pragma once

#include <cstdint>

#include "../format_list.h"
#include "common.cuh"

namespace decodescope {
namespace blocks {

// The weights the GEMV reads, the rows of ../format_list.h whose cuda column says gemv (fp16, bf16, int8, q4).
#define DECODESCOPE_CUDA_FORMAT(name_, bits_, block_, cpu_, code_, activations_, cuda_) \
  DECODESCOPE_CUDA_GEMV_##cuda_(name_, )
enum class Format { DECODESCOPE_FORMATS(DECODESCOPE_CUDA_FORMAT) };
#undef DECODESCOPE_CUDA_FORMAT

constexpr int kBlock = 32;  // inputs per quantization block

template <Format F>
constexpr bool kDense = F == Format::fp16 || F == Format::bf16;

template <Format F>
constexpr int kPerLoad = F == Format::q4 ? 32 : 16;  // inputs in one fetch: one 16-byte load, two for dense

template <Format F>
constexpr int kLoads = kDense<F> ? 2 : 1;  // 16-byte loads per fetch

template <Format F>
using Fetch = Vec<uint32_t, 4 * kLoads<F>>;

// Inputs a row holds: in rounded up to whole blocks; dense rows are not padded.
template <Format F>
__host__ __device__ constexpr int padded(int in) {
  return kDense<F> ? in : ceil_div(in, kBlock) * kBlock;
}

// Bytes of one row of in_pad = padded(in) inputs.
template <Format F>
__host__ __device__ constexpr int64_t row_bytes(int in_pad) {
  return F == Format::int8 ? in_pad : F == Format::q4 ? in_pad / 2 : int64_t{2} * in_pad;
}

// A dense row's 16 inputs from col (zeros past in): two streamed 16-byte loads where the row allows (vectors: every
// row starts 16-byte aligned), else one 16-bit load each.
template <Format F>
__device__ __forceinline__ Fetch<F> load_dense(const uint16_t* row, int col, int in, bool vectors) {
  static_assert(kDense<F>);
  if (vectors && col + 16 <= in) {
    const Vec<uint32_t, 4> a = load_stream16(row + col), b = load_stream16(row + col + 8);
    return {{a.v[0], a.v[1], a.v[2], a.v[3], b.v[0], b.v[1], b.v[2], b.v[3]}};
  }
  Fetch<F> w{};
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const uint32_t u = col + e < in ? row[col + e] : 0u;
    w.v[e / 2] |= e % 2 == 0 ? u : u << 16;
  }
  return w;
}

// 16 bytes of weights as small integers in fp32, exactly and without I2F (a quarter-rate conversion): a byte u
// placed under the exponent of 2^23 reads as 2^23 + u, one PRMT (or LOP3) and one FADD. int8: q in [-127, 127]
// (the sign bit flipped first: u = q + 128). q4: q in [0, 15] in GGUF order, byte j holding element j in its
// low nibble and element j + 16 in its high one. Either way q[e] is the load's input e. Dense: the weights
// themselves, exactly (bf16 is fp32's upper half).
template <Format F>
__device__ __forceinline__ void unpack(const Fetch<F>& w, float (&q)[kPerLoad<F>]) {
  constexpr float k2p23 = 8388608.f;
#pragma unroll
  for (int k = 0; k < 4 * kLoads<F>; ++k) {
    if constexpr (F == Format::fp16) {
      q[2 * k] = __half2float(__ushort_as_half(static_cast<unsigned short>(w.v[k] & 0xffffu)));
      q[2 * k + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w.v[k] >> 16)));
    } else if constexpr (F == Format::bf16) {
      q[2 * k] = __uint_as_float(w.v[k] << 16);
      q[2 * k + 1] = __uint_as_float(w.v[k] & 0xffff0000u);
    } else if constexpr (F == Format::int8) {
      const uint32_t u = w.v[k] ^ 0x80808080u;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        q[4 * k + b] = __uint_as_float(__byte_perm(u, 0x4b00u, 0x5440u | b)) - (k2p23 + 128.f);
      }
    } else {
      const uint32_t lo = w.v[k] & 0x0f0f0f0fu, hi = (w.v[k] >> 4) & 0x0f0f0f0fu;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        q[4 * k + b] = __uint_as_float(__byte_perm(lo, 0x4b00u, 0x5440u | b)) - k2p23;
        q[4 * k + b + 16] = __uint_as_float(__byte_perm(hi, 0x4b00u, 0x5440u | b)) - k2p23;
      }
    }
  }
}

}  // namespace blocks
}  // namespace decodescope
