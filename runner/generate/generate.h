// `runner generate`: completions of prompts by a trained model.
//
// Text: prompts are encoded and completions decoded with the run's tokenizer (a
// tok::Tokenizer; none: the ids are bytes, the addition task and byte-level text). Decoding is
// incremental (TextStream): a streamed completion never splits a multi-byte character over two
// writes. Raw ids (--tokens) bypass the tokenizer both ways.
//
// With the KV cache (the default; runner/generate/decoder.h): the prompts run as one batch
// through the model builder's graph (every prompt one row, padded to the longest; the
// attention is causal, so a row's padding never reaches its real positions), storing each
// layer's K and V, and then every step runs the builder's decode graph, one token per row
// at its own position, attending over the cache. Without it (kv_cache = false, the
// reference), each step runs the graph over the whole prefix. Either way every unfinished
// row's next token comes from its last real position's logits.
//
// Sampling: temperature 0 is greedy (the largest logit, the smallest id among equals, as the
// trainer's evaluation picks); otherwise softmax(logits / temperature), cut to the top_k most
// likely tokens (0: all) and then to the smallest set whose probability reaches top_p (1: all),
// drawn with a counter-based generator keyed by (seed, prompt index): a prompt's completion
// does not depend on the other prompts in the batch.
//
// On a device (cpu-strict, a GPU) the model, its activations and the KV cache stay in device
// memory; the prompts cross in as the graphs' tokens, and only the logits rows a token is
// chosen from cross out (logits_rows_to_host): sampling runs on the host.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runner/tokenize/tokenizer.h"
#include "runner/trained/trained_model.h"

namespace runner {

struct SamplingConfig {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no cut
  double top_p = 1.0;        // 1: no cut
  uint64_t seed = 0;
};

struct GenerateRequest {
  std::vector<std::string> prompts;
  // Raw token ids per prompt (--tokens): used instead of encoding `prompts` when not empty.
  std::vector<std::vector<int32_t>> prompt_ids;
  // Encodes the prompts and decodes the completions; null: the ids are the text's bytes.
  const tok::Tokenizer* tokenizer = nullptr;
  int64_t max_new_tokens = 32;
  std::string stop;          // a completion ends once it ends with this (kept); empty: never
  SamplingConfig sampling;
  bool kv_cache = true;      // false: every step a full forward pass over the prefix (the reference; --no-kv-cache)
  // Hears the logits (the real vocabulary) each chosen token came from, before it is chosen
  // (--logits-out; may be empty).
  std::function<void(size_t prompt, const float* logits, int64_t vocab)> on_logits;
};

struct Completion {
  std::string prompt, completion;  // completion: the new tokens decoded
  std::vector<int32_t> tokens;  // the new tokens
  std::string finish;           // "stop" or "length"
};

// What a request cost (runner generate --stats, bench/generate.py): positions computed and
// wall time of the prefill (the first token's forward) and of the decode steps after it, and
// the KV cache's bytes (0 without the cache).
struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  size_t kv_cache_bytes = 0;
};

// Throws UserError before running (or allocating) anything: an empty prompt, a token over the vocabulary, a
// prompt plus max_new_tokens over the model's context (seq_len), more prompts than the plan's
// inference.max_batch (when the recipe has an inference section), with the cache more prompts
// than inference.batch or a prompt plus max_new_tokens over inference.context, a bad
// sampling parameter.
// `on_token(prompt index, token)` hears every new token as it is chosen (may be empty).
std::vector<Completion> generate(TrainedModel& m, const GenerateRequest& req,
                                 const std::function<void(size_t, int32_t)>& on_token = {},
                                 GenerateStats* stats = nullptr);

// The text of a growing token sequence, handed out as it becomes final (as Hugging Face's
// TextStreamer): the whole sequence decoded, the new text past what was handed out, held back
// while it ends in an unfinished UTF-8 sequence or the replacement character a byte-level
// decoder gives a partial one. A tokenizer whose decode is not prefix-stable (a SentencePiece
// leading space) hands out only text past what it already did.
class TextStream {
 public:
  explicit TextStream(const tok::Tokenizer* tk) : tk_(tk) {}  // null: the ids are bytes
  std::string push(int32_t id);        // the text that became final with `id`
  std::string finish();                // the rest (an unfinished character included)
  const std::string& text() const { return text_; }  // everything decoded so far
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  const tok::Tokenizer* tk_;
  std::vector<int32_t> ids_;
  std::string text_;
  size_t out_ = 0;  // bytes of text_ handed out
};

// Space-separated token ids ("15496 11 995"); throws UserError naming the prompt and the word.
std::vector<int32_t> parse_token_ids(const std::string& text, size_t prompt);

// The next token from one row of logits (vocab entries) under `s`; `u` is the uniform draw in
// [0, 1) for this choice (unused when greedy).
int32_t sample_token(const float* logits, int64_t vocab, const SamplingConfig& s, float u);

}  // namespace runner
