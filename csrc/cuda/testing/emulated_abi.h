// What every emulated_*.cpp library exports besides its kernels (include it once per library), and the dtype
// codes of its C ABI:
// 0 float32, 1 float16, 2 bfloat16.
#pragma once

#include "cuda_on_cpu.h"

namespace {

// fn(T{}) for the dtype code; cudaErrorInvalidValue for an unknown one.
template <typename Fn>
int with_dtype(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0: return fn(float{});
    case 1: return fn(__half{});
    case 2: return fn(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" {

const char* emu_last_error() { return cuda_on_cpu::last_error.c_str(); }

void emu_set_schedule(int eager_copies, int reverse_threads, int reverse_blocks) {
  cuda_on_cpu::set_schedule(eager_copies != 0, reverse_threads != 0, reverse_blocks != 0);
}

}  // extern "C"
