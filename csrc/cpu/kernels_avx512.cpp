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

#include "table.h"
#include "simd_avx512.h"

namespace decodescope::cpu {

constinit const KernelTable kAvx512Table = kernel_table<Avx512>(Avx512::kName, Gemm<Avx512>::linears());

const KernelTable& avx512_table() { return kAvx512Table; }

}  // namespace decodescope::cpu

#pragma GCC pop_options
