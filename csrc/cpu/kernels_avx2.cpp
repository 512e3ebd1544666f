// The kernels compiled for AVX2 with FMA and F16C (the floor): every function defined below the pragma
// may use those instructions, so isa.cpp hands out this table only on a CPU that has them. The standard
// headers come first, outside the pragma, so no library code is compiled for this instruction set.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "attention.h"
#include "gemm.h"
#include "rowwise.h"
#include "simd_avx2.h"

namespace decodescope::cpu {

const KernelTable& avx2_table() {
  using G = Gemm<Avx2>;
  using R = Rowwise<Avx2>;
  using A = Attention<Avx2>;
  static const KernelTable table{Avx2::kName, G::linear_f32, G::linear_f16, G::linear_q4, G::linear_int8,
                                 G::linear_q8, G::quantize_rows, R::norm, R::silu_mul, R::rope, A::run, A::merge};
  return table;
}

}  // namespace decodescope::cpu

#pragma GCC pop_options
