// Which kernel table this CPU runs: chosen once, at load, by CPU feature detection (the way oneDNN and
// FBGEMM dispatch), never per call. Torch-free.
#pragma once

#include <string>

#include "kernels.h"

namespace decodescope::cpu {

// "" when the CPU has the floor (AVX2 + FMA + F16C), else a sentence naming what is missing.
std::string missing_features();

// The table in use: AMX where the CPU has AMX-TILE/INT8 with AVX-512 VNNI and Linux grants this process the
// tile state, else AVX-512 (F, BW, VL, DQ, VNNI), else AVX2. Only call when missing_features() is "".
const KernelTable& kernels();

// Switches the table ("avx2", "avx512" or "amx"); an empty string when done, else why not.
std::string use_isa(const std::string& name);

// The table in use in words: its name, the AMX crossover, and why AMX does not run where the CPU has it.
std::string describe();

// The amx table runs q4 and q8 on tiles from this many rows up (VNNI below: the same bits, cheaper there).
int amx_min_rows();
void set_amx_min_rows(int rows);

}  // namespace decodescope::cpu
