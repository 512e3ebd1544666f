// CPU feature detection and the one choice of kernel table (see isa.h).
#include "isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

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

// Whether the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24, 25; gcc 12's __builtin_cpu_supports
// knows no AMX names) and the OS saves their state (XCR0 bits 17, 18: XTILECFG, XTILEDATA).
bool cpu_has_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return false;  // OSXSAVE: xgetbv is there to ask
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo >> 17 & 3) == 3;
}

// Linux hands out the AMX tile data only on request, once per process, for all its threads (arch_prctl
// ARCH_REQ_XCOMP_PERM with XFEATURE_XTILEDATA); without it the first tile instruction faults. "" when
// granted, else why not; asked once.
const std::string& amx_refused() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  static const std::string why = [] {
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return std::string();
    return std::string("Linux refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") +
           std::strerror(errno) + ")";
  }();
  return why;
}

// Why the amx table cannot run here, or "".
std::string amx_problem() {
  if (!has_avx512()) return "this CPU lacks AVX-512 with VNNI, which the amx kernels need below the crossover";
  if (!cpu_has_amx()) return "this CPU lacks AMX-TILE / AMX-INT8 (or its OS does not save the tile state)";
  return amx_refused();
}

const KernelTable* best() {
  if (has_avx512() && cpu_has_amx() && amx_refused().empty()) return &amx_table();
  return has_avx512() ? &avx512_table() : &avx2_table();
}

// Read on every call, written only by set_isa (tests); the pointer is what a call dispatches through.
std::atomic<const KernelTable*> current{nullptr};
// q4 and q8 passes of at least this many rows run on AMX tiles in the amx table: measured whole steps of the
// default model (bench/results/verify-cpu.md) put the crossover with the VNNI tiles here.
std::atomic<int> amx_rows{10};

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
  if (name == "amx") {
    const std::string why = amx_problem();
    if (!why.empty()) return why;
    current.store(&amx_table(), std::memory_order_release);
    return "";
  }
  return "isa must be 'avx2', 'avx512' or 'amx', got '" + name + "'";
}

// By the table's name. The tables are constinit data (table.h), so no code of another instruction set runs to
// reach one (tests/test_kernels_cpu.py reads the built library to hold that).
std::string describe() {
  const KernelTable& t = kernels();
  const std::string name = t.name;
  if (name == "amx") return "amx (int8 tiles from T >= " + std::to_string(amx_min_rows()) + ", avx512 vnni below)";
  std::string s = name;
  if (name.rfind("avx512", 0) == 0 && cpu_has_amx() && !amx_refused().empty()) s += "; amx off: " + amx_refused();
  return s;
}

int amx_min_rows() { return amx_rows.load(std::memory_order_relaxed); }
void set_amx_min_rows(int rows) { amx_rows.store(rows < 1 ? 1 : rows, std::memory_order_relaxed); }

}  // namespace decodescope::cpu
