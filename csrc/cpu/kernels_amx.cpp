// The kernels compiled for AVX-512 with VNNI and AMX-TILE / AMX-INT8: the avx512 table, its q4 and q8 GEMMs
// on tiles from amx_min_rows() rows up (amx.h; below that the VNNI tiles compute the same bits for less).
// isa.cpp hands this table out only on a CPU with AMX whose tile state Linux granted this process. The
// standard headers come first, outside the pragma, so no library code is compiled for this instruction set.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include <immintrin.h>

#include "isa.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")

#include "simd_avx512.h"  // first: amx.h names Avx512 outside a template
#include "amx.h"
#include "table.h"

namespace decodescope::cpu {
namespace {

using G = Gemm<Avx512>;

void linear_q4(const LinearArgs& a, int64_t p0, int64_t p1) {
  if (a.rows >= amx_min_rows()) Amx::linear_q4(a, p0, p1);
  else G::linear_q4(a, p0, p1);
}

void linear_q8(const LinearArgs& a, int64_t p0, int64_t p1) {
  if (a.rows >= amx_min_rows()) Amx::linear_q8(a, p0, p1);
  else G::linear_q8(a, p0, p1);
}

constexpr std::array<LinearFn, kNumFormats> linears() {
  std::array<LinearFn, kNumFormats> t = G::linears();
  t[kQ4] = linear_q4;
  t[kQ8] = linear_q8;
  return t;
}

}  // namespace

constinit const KernelTable kAmxTable = kernel_table<Avx512>("amx", linears());

const KernelTable& amx_table() { return kAmxTable; }

}  // namespace decodescope::cpu

#pragma GCC pop_options
