// Environment variables a test sets in its own process for one scope. The runner reads its
// RUNNER_* knobs once (ops/knobs.h), so a test that changes one at run time must have them read
// again: ScopedEnv sets (or unsets) the variable, re-reads the knobs, and on leaving the scope
// restores what was there and re-reads them once more. A child process started inside the scope
// inherits the variable as usual.
#pragma once
#include <optional>
#include <string>

namespace test_support {

class ScopedEnv {
 public:
  // value nullptr: unset the variable for the scope.
  ScopedEnv(const char* name, const char* value);
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name, value.c_str()) {}
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Re-reads the knobs after a test changed the environment by other means (setenv).
void reload_knobs();

}  // namespace test_support
