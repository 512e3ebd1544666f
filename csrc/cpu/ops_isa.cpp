// Torch-facing wrappers of isa.h: what the module reports and the tests' switch between paths.
#include <c10/util/Exception.h>

#include "isa.h"
#include "ops.h"

namespace decodescope::cpu {

std::string isa() { return kernels().name; }

std::string unsupported() { return missing_features(); }

void set_isa(const std::string& name) {
  const std::string why = use_isa(name);
  TORCH_CHECK(why.empty(), "set_isa('", name, "'): ", why);
}

}  // namespace decodescope::cpu
