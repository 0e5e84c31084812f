// Internal invariants of ops/: OPS_CHECK aborts loudly with where it happened.
//
// ops/ sits below parallel/ and runner/ and cannot use runner's RUNNER_CHECK (the build
// refuses an include that points up a layer). A failed check here is a bug in the caller or
// in a kernel, never something a user can cause: user input is checked, with a message that
// says how to fix it, by runner/ before it reaches a kernel.
#pragma once
#include <string>

namespace ops {
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace ops

#define OPS_CHECK(cond, msg) \
  do { if (!(cond)) ::ops::check_failed(#cond, __FILE__, __LINE__, (msg)); } while (0)
