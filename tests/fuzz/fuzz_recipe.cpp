// libFuzzer target: the recipe loader on arbitrary bytes (scripts/fuzz.sh runs it).
// A recipe is untrusted input: every byte string must either load or be refused with a
// UserError (exit 2 in `runner`). Any other exception, a crash, a sanitizer report or a
// timeout is a bug in our code, and libFuzzer stops with the input saved as crash-*.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runner/errors.h"
#include "runner/recipe/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    runner::Recipe r = runner::load_recipe_text(text, "fuzz.yaml");
    (void)runner::recipe_to_yaml(r);  // a loaded recipe must also write back
  } catch (const runner::UserError&) {
    // the expected refusal
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_recipe: not a UserError: %s\n", e.what());
    std::abort();
  }
  return 0;
}
