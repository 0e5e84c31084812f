// SentencePiece .model files through libsentencepiece (sentencepiece.cpp): loading one, and
// training one on the user's corpus for `runner data tokenizer train`.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

// The most pieces a .model may have (the largest published vocabularies hold about 256k).
inline constexpr int kMaxSpPieces = 1 << 22;

// `bytes`: the .model file's content; `path` names it in errors.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, std::string bytes, std::string name);

struct SpModelView;
// A Hugging Face tokenizer.json giving the same ids as the model (nullopt for a model whose
// normalization has no exact counterpart there); save() writes it beside tokenizer.model.
std::optional<std::string> hf_tokenizer_json(const SpModelView& m);

struct TrainOptions {
  std::vector<std::string> inputs;  // text files (one sentence or paragraph per line); .jsonl/.ndjson: each record's `field`
  std::string field = "text";
  std::string out_dir;              // receives tokenizer.model and tokenizer_config.json
  std::string final_dir;            // where out_dir is published afterwards (its name, messages); empty: out_dir
  int vocab_size = 8000;
  std::string model_type = "bpe";   // "bpe" or "unigram"
  int threads = 0;                  // 0: every core
  double character_coverage = 0.9995;  // in [0.98, 1]: share of the corpus's characters that get a piece (the rest: bytes)
};

// Llama-style settings: no Unicode normalization, whitespace kept as it is, digits split,
// byte fallback (so decoding gives back any text exactly). JSONL inputs give the text of each
// record's `field`, as data prepare reads them. Lines longer than SentencePiece's sentence
// bound (kMaxTrainLine bytes), which its trainer leaves out, are counted and reported in one
// line; its own log stays quiet. Throws UserError for a missing input or a vocabulary the
// corpus cannot fill; prints progress and timing.
inline constexpr size_t kMaxTrainLine = 16384;
void train_sentencepiece(const TrainOptions& opt);

}  // namespace runner::tok
