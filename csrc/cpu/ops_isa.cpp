// Torch-facing wrappers of isa.h: what the module reports and the tests' switches between paths.
#include <c10/util/Exception.h>

#include "isa.h"
#include "ops.h"

namespace decodescope::cpu {

std::string isa() { return describe(); }

std::string unsupported() { return missing_features(); }

void set_isa(const std::string& name) {
  const std::string why = use_isa(name);
  TORCH_CHECK(why.empty(), "set_isa('", name, "'): ", why);
}

int64_t amx_rows() { return amx_min_rows(); }

void set_amx_rows(int64_t rows) {
  TORCH_CHECK(rows >= 1 && rows <= 1 << 20, "rows must be in [1, 2^20], got ", rows);
  set_amx_min_rows(static_cast<int>(rows));
}

}  // namespace decodescope::cpu
