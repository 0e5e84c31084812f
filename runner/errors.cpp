// Formatting of user errors and internal check failures (see errors.h).
// GCC 12 reports a false -Wrestrict inside std::string's operator+ (GCC bug 105329); the
// pragma must precede <string> to cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

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

UserError::UserError(std::vector<Entry> all)
    : std::runtime_error(format_all(all)),
      loc_(all.empty() ? SourceLoc{} : all.front().loc),
      what_(all.empty() ? std::string() : all.front().what),
      fix_(all.empty() ? std::string() : all.front().fix),
      more_(all.size() > 1 ? std::move(all) : std::vector<Entry>{}) {}

std::string UserError::format_all(const std::vector<Entry>& all) {
  // A screenful at most: garbage (a binary file read as a recipe) can hold thousands.
  constexpr size_t kShown = 40;
  std::string s;
  for (size_t i = 0; i < all.size() && i < kShown; ++i) s += (s.empty() ? "" : "\n") + format(all[i].loc, all[i].what, all[i].fix);
  if (all.size() > kShown) s += "\n... and " + std::to_string(all.size() - kShown) + " more";
  if (all.size() > 1) s += "\n" + std::to_string(all.size()) + " problems: fix them all, then check again";
  return s;
}

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error at %s:%d: check `%s` failed: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace runner
