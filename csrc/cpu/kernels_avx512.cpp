// The kernels compiled for AVX-512 (F, BW, VL, DQ) with VNNI: every function defined below the pragma
// may use those instructions, so isa.cpp hands out this table only on a CPU that has them. The standard
// headers come first, outside the pragma, so no library code is compiled for this instruction set.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

#include "attention.h"
#include "gemm.h"
#include "rowwise.h"
#include "simd_avx512.h"

namespace decodescope::cpu {

const KernelTable& avx512_table() {
  using G = Gemm<Avx512>;
  using R = Rowwise<Avx512>;
  using A = Attention<Avx512>;
  static const KernelTable table{.name = Avx512::kName,
                                 .linear = G::linears(),
                                 .quantize_rows = G::quantize_rows,
                                 .quantize_rows16 = quantize_rows16<Avx512>,
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
