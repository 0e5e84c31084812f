// Scoped environment variables for tests (env.h).
#include "tests/support/env.h"

#include <cstdlib>

#include "ops/knobs.h"

namespace test_support {

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  if (const char* o = std::getenv(name)) old_ = o;
  if (value) ::setenv(name, value, 1);
  else ::unsetenv(name);
  try {
    ops::reload_knobs();
  } catch (...) {  // a malformed value: the environment goes back as it was, the error to the test
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
    ops::reload_knobs();
    throw;
  }
}

ScopedEnv::~ScopedEnv() {
  if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
  else ::unsetenv(name_.c_str());
  ops::reload_knobs();  // the outer scope's values parsed before; a throw here cannot happen for them
}

void reload_knobs() { ops::reload_knobs(); }

}  // namespace test_support
