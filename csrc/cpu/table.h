// One instruction set's KernelTable (kernels.h): gemm.h's, rowwise.h's and attention.h's templates instantiated for
// S, compiled under the target pragma of the file that includes this one (kernels_<isa>.cpp). `linear` is the GEMMs
// by format: Gemm<S>::linears(), or the AMX file's, which swaps some formats' kernels for its tiles.
// constexpr, and each kernels_<isa>.cpp keeps its table as a constinit object: the table is data in the library,
// set before any code runs, so handing out or naming a table never executes code compiled for its instruction set
// (a function-local static built at first call did, and took the process down with SIGILL on an AVX2-only CPU).
#pragma once

#include <array>

#include "attention.h"
#include "gemm.h"
#include "kernels.h"
#include "rowwise.h"

namespace decodescope::cpu {

template <class S>
constexpr KernelTable kernel_table(const char* name, const std::array<LinearFn, kNumFormats>& linear) {
  using G = Gemm<S>;
  using R = Rowwise<S>;
  using A = Attention<S>;
  return KernelTable{.name = name,
                     .linear = linear,
                     .quantize_rows = G::quantize_rows,
                     .quantize_rows16 = quantize_rows16<S>,
                     .quantize_rows_k = G::quantize_rows_k,
                     .norm = R::norm,
                     .silu_mul = R::silu_mul,
                     .gelu_tanh_mul = R::gelu_tanh_mul,
                     .exp_span = R::exp_span,
                     .scale_max = R::scale_max,
                     .exp_total = R::exp_total,
                     .above = R::above,
                     .collect = R::collect,
                     .rope = R::rope,
                     .attention = A::run,
                     .attention_merge = A::merge};
}

}  // namespace decodescope::cpu
