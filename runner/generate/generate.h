// `runner generate`: completions of byte-level prompts by a trained model.
//
// Each step runs the model builder's graph for the batch (every prompt one row, the rows
// padded to the longest sequence; the attention is causal, so a row's padding never reaches
// its real positions) through the executor, as training and evaluation do, and takes every
// unfinished row's next token from its last real position's logits. There is no KV cache yet:
// a step recomputes the whole prefix (see docs/generate.md for what is and is not done).
//
// Sampling: temperature 0 is greedy (the largest logit, the smallest id among equals, as the
// trainer's evaluation picks); otherwise softmax(logits / temperature), cut to the top_k most
// likely tokens (0: all) and then to the smallest set whose probability reaches top_p (1: all),
// drawn with a counter-based generator keyed by (seed, prompt index): a prompt's completion
// does not depend on the other prompts in the batch.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runner/generate/trained_model.h"

namespace runner {

struct SamplingConfig {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no cut
  double top_p = 1.0;        // 1: no cut
  uint64_t seed = 0;
};

struct GenerateRequest {
  std::vector<std::string> prompts;
  int64_t max_new_tokens = 32;
  std::string stop;          // a completion ends once it ends with this (kept); empty: never
  SamplingConfig sampling;
};

struct Completion {
  std::string prompt, completion;
  std::vector<int32_t> tokens;  // the new tokens
  std::string finish;           // "stop" or "length"
};

// Throws UserError before running anything: an empty prompt, a token over the vocabulary, a
// prompt plus max_new_tokens over the model's context (seq_len), more prompts than the plan's
// inference.max_batch (when the recipe has an inference section), a bad sampling parameter.
// `on_token(prompt index, token)` hears every new token as it is chosen (may be empty).
std::vector<Completion> generate(TrainedModel& m, const GenerateRequest& req,
                                 const std::function<void(size_t, int32_t)>& on_token = {});

// The next token from one row of logits (vocab entries) under `s`; `u` is the uniform draw in
// [0, 1) for this choice (unused when greedy).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingConfig& s, float u);

}  // namespace runner
