// The UserError a call must throw, for the tests of what users are told (the recipe, data and
// plan tests). Design: the test gets the error itself and checks its message, location and fix
// as it needs; a call that throws nothing, or something else, fails the test here.
#pragma once
#include <doctest/doctest.h>

#include "runner/errors.h"

namespace test_support {

// Runs `f`, which must throw runner::UserError; returns it. `otherwise` is the failure's message.
template <class F>
runner::UserError expect_user_error(F&& f, const char* otherwise = "expected a UserError") {
  try {
    f();
  } catch (const runner::UserError& e) {
    return e;
  }
  FAIL(otherwise);
  return runner::UserError(runner::SourceLoc{}, "");
}

}  // namespace test_support
