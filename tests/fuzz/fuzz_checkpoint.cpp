// libFuzzer target: the checkpoint readers (`runner inspect`, verify, the recipe and step
// readers used by `runner resume`) on arbitrary bytes, written to a temporary file because
// they take a path. Seeded by scripts/fuzz.sh with one small real checkpoint, so mutations
// reach HDF5's metadata and our checks behind it. A refusal is a UserError; any other
// exception, a crash or a sanitizer report is a bug. HDF5 itself is not instrumented:
// scripts/fuzz.sh tells a crash inside libhdf5 from one in our code.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"

namespace {
const std::string& temp_path() {
  static const std::string p = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/fuzz_checkpoint." + std::to_string(::getpid()) + ".h5";
  }();
  return p;
}

template <class F>
void expect_user_error(const char* what, F&& f) {
  try {
    f();
  } catch (const runner::UserError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_checkpoint: %s threw a non-UserError: %s\n", what, e.what());
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = temp_path();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  if (size && std::fwrite(data, 1, size, f) != size) {
    std::fclose(f);
    return 0;
  }
  std::fclose(f);
  expect_user_error("inspect_checkpoint", [&] {
    bool ok = false;
    (void)runner::inspect_checkpoint(path, &ok);
  });
  expect_user_error("verify_checkpoint_file", [&] { runner::verify_checkpoint_file(path); });
  expect_user_error("read_checkpoint_step", [&] { (void)runner::read_checkpoint_step(path); });
  expect_user_error("read_recipe_text", [&] { (void)runner::read_recipe_text(path); });
  ::unlink(path.c_str());
  return 0;
}
