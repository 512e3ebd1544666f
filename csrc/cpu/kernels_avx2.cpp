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

#include "noise.h"
#include "table.h"
#include "simd_avx2.h"

namespace decodescope::cpu {

void exp_noise(uint32_t key_lo, uint32_t key_hi, float* out, int64_t i0, int64_t i1) {
  exp_noise_rows(key_lo, key_hi, out, i0, i1);
}

void race_keyed(uint32_t key_lo, uint32_t key_hi, const float* w, int64_t i0, int64_t i1, float* best, int64_t* at) {
  race_keyed_span(key_lo, key_hi, w, i0, i1, best, at);
}

constinit const KernelTable kAvx2Table = kernel_table<Avx2>(Avx2::kName, Gemm<Avx2>::linears());

const KernelTable& avx2_table() { return kAvx2Table; }

}  // namespace decodescope::cpu

#pragma GCC pop_options
