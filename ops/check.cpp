// A failed OPS_CHECK (see check.h): report and abort.
#include "ops/check.h"

#include <cstdio>
#include <cstdlib>

namespace ops {

void check_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "internal error at %s:%d: check `%s` failed: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ops
