// Resuming on another layout (see relayout.h).
#include "runner/plan/relayout.h"

#include <fmt/format.h>

namespace runner {

namespace {

// Whether the user's --set overrides gave `field` or anything under it ("parallel" covers
// "parallel.tp"): the recipe records where each field was written.
bool overridden(const Recipe& r, const std::string& field) {
  for (const auto& [path, loc] : r.locs)
    if (loc.file == "--set" && (path == field || path.rfind(field + ".", 0) == 0 || path.rfind(field + "[", 0) == 0))
      return true;
  return false;
}

}  // namespace

std::vector<std::string> rederive_for_new_layout(Recipe& r) {
  std::vector<std::string> again;
  if (!overridden(r, "parallel")) return again;
  if (!overridden(r, "parallel.dp")) {
    again.push_back(fmt::format("dp (was {})", r.parallel.dp));
    r.parallel.dp = 0;
  }
  if (!overridden(r, "batch")) {
    again.push_back(fmt::format("accum (was {})", r.batch.accum));
    r.batch.accum = 0;
  }
  return again;
}

}  // namespace runner
