// Formatting of user errors and internal check failures (see errors.h).
#include "runner/errors.h"

#include <cstdio>
#include <cstdlib>

namespace runner {

std::string SourceLoc::str() const {
  std::string s = file;
  if (line > 0) {
    s += (s.empty() ? "" : ":") + std::to_string(line);
    if (col > 0) s += ":" + std::to_string(col);
  }
  return s;
}

std::string UserError::format(const SourceLoc& loc, const std::string& what, const std::string& fix) {
  std::string s = loc.str();
  if (!s.empty()) s += ": ";
  s += what;
  if (!fix.empty()) s += "; " + fix;
  return s;
}

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error at %s:%d: check `%s` failed: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace runner
