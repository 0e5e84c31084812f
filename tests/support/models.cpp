// The small models the graph-level tests share (models.h).
#include "tests/support/models.h"

#include "ops/rng.h"

namespace test_support {

runner::ModelConfig small_model(int64_t vocab, int64_t seq_len, int64_t d_model, int64_t n_heads, int64_t n_layers) {
  runner::ModelConfig m;
  m.vocab_size = vocab;
  m.seq_len = seq_len;
  m.d_model = d_model;
  m.n_heads = n_heads;
  m.n_layers = n_layers;
  return m;
}

void make_llama(runner::ModelConfig& m) {
  m.norm = runner::Norm::rmsnorm;
  m.activation = runner::Activation::swiglu;
  m.position = runner::Position::rope;
  m.tie_embeddings = false;
  m.bias = false;
}

TokenBatch random_tokens(int64_t n, int64_t vocab) {
  TokenBatch b{std::vector<int32_t>(static_cast<size_t>(n)), std::vector<int32_t>(static_cast<size_t>(n))};
  for (int64_t i = 0; i < n; ++i) {
    b.tok[static_cast<size_t>(i)] = static_cast<int32_t>(ops::rng_u32(3, static_cast<uint64_t>(i)) % vocab);
    b.tgt[static_cast<size_t>(i)] = static_cast<int32_t>(ops::rng_u32(4, static_cast<uint64_t>(i)) % vocab);
  }
  return b;
}

}  // namespace test_support
