// The GGUF block formats as the CUDA kernels read them (gemv.cuh, dequantize.cuh): a weight row is whole blocks
// of 32 inputs, int8 (Q8_0) one byte per input, q4 (Q4_1) two nibbles a byte; each block has an fp16 scale d
// (and, for q4, a min m): w = d * q (+ m). Both kernels read a row 16 bytes at a time: 16 int8 inputs or 32 q4
// inputs (one whole block) per load.
#pragma once

#include <cstdint>

#include "common.cuh"

namespace decodescope {
namespace blocks {

enum class Format { int8, q4 };

constexpr int kBlock = 32;  // inputs per quantization block

template <Format F>
constexpr int kPerLoad = F == Format::int8 ? 16 : 32;  // inputs in one 16-byte load

// Bytes of one row of in_pad inputs (a whole number of blocks).
template <Format F>
__host__ __device__ constexpr int64_t row_bytes(int in_pad) {
  return F == Format::int8 ? in_pad : in_pad / 2;
}

// 16 bytes of weights as small integers in fp32, exactly and without I2F (a quarter-rate conversion): a byte u
// placed under the exponent of 2^23 reads as 2^23 + u, one PRMT (or LOP3) and one FADD. int8: q in [-127, 127]
// (the sign bit flipped first: u = q + 128). q4: q in [0, 15] in GGUF order, byte j holding element j in its
// low nibble and element j + 16 in its high one. Either way q[e] is the load's input e.
template <Format F>
__device__ __forceinline__ void unpack(const Vec<uint32_t, 4>& w, float (&q)[kPerLoad<F>]) {
  constexpr float k2p23 = 8388608.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (F == Format::int8) {
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
