// The Llama-style quickstart (recipes/quickstart-llama.yaml: RMSNorm, SwiGLU, RoPE, grouped-query
// attention, untied embeddings, no biases) learns 3-digit addition to >= 90% exact-match accuracy
// on held-out problems, like the GPT quickstart beside it (test_quickstart.cpp). Before its
// recipe was tuned, this family stalled at ~10%: one answer digit at chance (the recipe's header
// says why and what was measured). One training through the binary, 1500 steps of a 3-layer
// model: ~3-4 min on 2 cores (measured 256 s on a loaded machine), longer than the GPT's.
#include <doctest/doctest.h>

#include "runner/recipe/recipe.h"
#include "tests/support/recipes.h"

using namespace test_support;

TEST_CASE("the Llama-style quickstart is the Llama family, with grouped-query attention") {
  const runner::ModelConfig m = runner::load_recipe(quickstart_llama_recipe()).model;
  CHECK(m.norm == runner::Norm::rmsnorm);
  CHECK(m.activation == runner::Activation::swiglu);
  CHECK(m.position == runner::Position::rope);
  CHECK_FALSE(m.tie_embeddings);
  CHECK_FALSE(m.bias);
  CHECK(m.kv_heads() < m.n_heads);
  CHECK(m.n_heads % m.kv_heads() == 0);
}

TEST_CASE("the Llama-style quickstart learns 3-digit addition on held-out problems") {
  const quickstart::Run r = quickstart::train("fp32", quickstart_llama_recipe());
  MESSAGE("held-out loss " << r.first_val << " -> " << r.last_val << ", accuracy " << r.accuracy);
  quickstart::check_learns(r);
  // Stalled runs of this family sit at a held-out loss near ln(10)/5 = 0.46 (one of the five
  // answer tokens guessed): a learned model is well below it.
  CHECK(r.last_val < 0.2);
}
