// describe_tensor: how the records name a tensor in logs.
#include "runner/observe/records.h"

#include <fmt/format.h>

namespace runner {

std::string describe_tensor(const GradRange& t) {
  if (t.layer >= 0) return fmt::format("{} (layer {})", t.name, t.layer);
  const bool head = t.name.find("head") != std::string::npos || t.name.rfind("ln_f", 0) == 0;
  return fmt::format("{} ({})", t.name, head ? "output layer" : "embedding");
}

}  // namespace runner
