// SentencePiece .model files through libsentencepiece (sentencepiece.cpp): loading one, and
// training one on the user's corpus for `runner data tokenizer train`.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

// `bytes`: the .model file's content; `path` names it in errors.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, std::string bytes, std::string name);

struct TrainOptions {
  std::vector<std::string> inputs;  // text files (one sentence or paragraph per line)
  std::string out_dir;              // receives tokenizer.model and tokenizer_config.json
  std::string final_dir;            // where out_dir is published afterwards (its name, messages); empty: out_dir
  int vocab_size = 8000;
  std::string model_type = "bpe";   // "bpe" or "unigram"
  int threads = 0;                  // 0: every core
  double character_coverage = 0.9995;  // in [0.98, 1]: share of the corpus's characters that get a piece (the rest: bytes)
};

// Llama-style settings: no Unicode normalization, whitespace kept as it is, digits split,
// byte fallback (so decoding gives back any text exactly). Throws UserError for a missing
// input or a vocabulary the corpus cannot fill; prints progress and timing.
void train_sentencepiece(const TrainOptions& opt);

}  // namespace runner::tok
