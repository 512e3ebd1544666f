// CPU feature detection and the one choice of kernel table (see isa.h).
#include "isa.h"

#include <atomic>

namespace decodescope::cpu {
namespace {

bool has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

const KernelTable* best() { return has_avx512() ? &avx512_table() : &avx2_table(); }

// Read on every call, written only by set_isa (tests); the pointer is what a call dispatches through.
std::atomic<const KernelTable*> current{nullptr};

}  // namespace

std::string missing_features() {
  __builtin_cpu_init();
  std::string missing;  // __builtin_cpu_supports takes a literal, hence no loop
  if (!__builtin_cpu_supports("avx2")) missing += " AVX2";
  if (!__builtin_cpu_supports("fma")) missing += " FMA";
  if (!__builtin_cpu_supports("f16c")) missing += " F16C";
  if (missing.empty()) return "";
  return "this CPU lacks" + missing + ", which the fused CPU kernels need (AVX2 + FMA + F16C at least)";
}

const KernelTable& kernels() {
  const KernelTable* t = current.load(std::memory_order_acquire);
  if (t == nullptr) {
    __builtin_cpu_init();
    t = best();
    current.store(t, std::memory_order_release);
  }
  return *t;
}

std::string use_isa(const std::string& name) {
  __builtin_cpu_init();
  if (name == "avx2") {
    if (!has_avx2()) return "this CPU lacks AVX2 + FMA + F16C";
    current.store(&avx2_table(), std::memory_order_release);
    return "";
  }
  if (name == "avx512") {
    if (!has_avx512()) return "this CPU lacks AVX-512 F/BW/VL/DQ with VNNI, which the avx512 kernels need";
    current.store(&avx512_table(), std::memory_order_release);
    return "";
  }
  return "isa must be 'avx2' or 'avx512', got '" + name + "'";
}

}  // namespace decodescope::cpu
