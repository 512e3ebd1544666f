// Which kernel table this CPU runs: chosen once, at load, by CPU feature detection (the way oneDNN and
// FBGEMM dispatch), never per call. Torch-free.
#pragma once

#include <string>

#include "kernels.h"

namespace decodescope::cpu {

// "" when the CPU has the floor (AVX2 + FMA + F16C), else a sentence naming what is missing.
std::string missing_features();

// The table in use: AVX-512 (F, BW, VL, DQ, VNNI) where the CPU has it, else AVX2. Only call when
// unsupported() is "".
const KernelTable& kernels();

// Switches the table ("avx2" or "avx512"); an empty string when done, else why not (the CPU lacks it).
std::string use_isa(const std::string& name);

}  // namespace decodescope::cpu
