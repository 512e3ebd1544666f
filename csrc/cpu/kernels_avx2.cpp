// The kernels compiled for AVX2 with FMA and F16C (the floor): every function defined below the pragma
// may use those instructions, so isa.cpp hands out this table only on a CPU that has them. The standard
// headers come first, outside the pragma, so no library code is compiled for this instruction set.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "attention.h"
#include "gemm.h"
#include "noise.h"
#include "rowwise.h"
#include "simd_avx2.h"

namespace decodescope::cpu {

void exp_noise(uint32_t key_lo, uint32_t key_hi, float* out, int64_t i0, int64_t i1) {
  exp_noise_rows(key_lo, key_hi, out, i0, i1);
}

void race_keyed(uint32_t key_lo, uint32_t key_hi, const float* w, int64_t i0, int64_t i1, float* best, int64_t* at) {
  race_keyed_span(key_lo, key_hi, w, i0, i1, best, at);
}

const KernelTable& avx2_table() {
  using G = Gemm<Avx2>;
  using R = Rowwise<Avx2>;
  using A = Attention<Avx2>;
  static const KernelTable table{.name = Avx2::kName,
                                 .linear = G::linears(),
                                 .quantize_rows = G::quantize_rows,
                                 .quantize_rows16 = quantize_rows16<Avx2>,
                                 .quantize_rows_k = G::quantize_rows_k,
                                 .norm = R::norm,
                                 .silu_mul = R::silu_mul,
                                 .gelu_tanh_mul = R::gelu_tanh_mul,
                                 .exp_span = R::exp_span,
                                 .rope = R::rope,
                                 .attention = A::run,
                                 .attention_merge = A::merge};
  return table;
}

}  // namespace decodescope::cpu

#pragma GCC pop_options
