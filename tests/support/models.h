// The small ModelConfig the graph-level tests build their models from (executor, precision,
// GEMM path, the multi-rank layers), and the random batch they feed it. Design: a test states the sizes it needs and its own
// extras (dropout, mlp_ratio) and takes the two model styles from here, so the list of what
// makes a model "Llama style" is written once.
#pragma once
#include <cstdint>
#include <vector>

#include "runner/recipe/recipe.h"

namespace test_support {

// A GPT-2 style model (layernorm, gelu, learned positions, tied embeddings, biases) of the
// given sizes.
runner::ModelConfig small_model(int64_t vocab, int64_t seq_len, int64_t d_model, int64_t n_heads, int64_t n_layers);

// Turns `m` into the Llama style: rmsnorm, swiglu, rope, untied embeddings, no biases.
void make_llama(runner::ModelConfig& m);

// `n` input tokens and `n` targets below `vocab`, drawn from the counter RNG (keys 3 and 4).
struct TokenBatch {
  std::vector<int32_t> tok, tgt;
};
TokenBatch random_tokens(int64_t n, int64_t vocab);

}  // namespace test_support
