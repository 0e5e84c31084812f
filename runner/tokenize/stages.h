// A Hugging Face-style tokenizer as data: added tokens, normalizers, pre-tokenizers, one
// model (BPE or Unigram) and decoders, each stage one of the kinds GPT-2, Llama 2/3 and
// Mistral use. tokenizer.json and the GPT-2 file pairs both load into it, so one encoder and
// one decoder serve every file format, and the hash is taken over this canonical form (a
// GPT-2 tokenizer.json and the vocab.json/merges.txt it was made from hash the same).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/tokenize/bpe.h"
#include "runner/tokenize/split.h"
#include "runner/tokenize/tokenizer.h"
#include "runner/tokenize/unigram.h"

namespace runner::tok {

struct NormalizerStep {
  enum Kind { prepend, replace, strip } kind;
  std::string a, b;          // prepend: a; replace: a -> b
  bool left = false, right = false;  // strip
};

struct PreTokenizerStep {
  enum Kind { split, byte_level, metaspace } kind;
  SplitPattern pattern = SplitPattern::gpt2;  // split; byte_level when use_regex
  bool use_regex = false;                      // byte_level
  bool add_prefix_space = false;               // byte_level
  std::string replacement = std::string(kMetaspace);  // metaspace
  enum Prepend { always, first, never } prepend = always;  // metaspace
  bool split_words = true;                     // metaspace
};

struct DecoderStep {
  enum Kind { replace, byte_fallback, fuse, strip, byte_level, metaspace } kind;
  std::string a, b;              // replace: a -> b; strip: a is the character
  int start = 0, stop = 0;       // strip
  bool prepend = true;           // metaspace: the first token's leading space is removed
};

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
};

struct Pipeline {
  std::string kind;  // "bpe-bytelevel", "bpe", "unigram"
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  std::vector<DecoderStep> decoders;
  std::vector<AddedToken> added;
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<UnigramModel> unigram;
  std::optional<int32_t> eos, bos;
};

// Bounds on what a tokenizer file may name, so a small file cannot make loading it costly:
// every id is below 2^24 (the largest published vocabularies hold about 256k) and below the
// count of entries the file holds (vocabulary and added tokens) plus kVocabIdSlack.
inline constexpr int64_t kMaxVocabIds = int64_t{1} << 24;
inline constexpr int64_t kVocabIdSlack = 1024;

// What save() writes: file name -> exact bytes.
struct SourceFiles {
  std::vector<std::pair<std::string, std::string>> files;
  std::string config;  // the source's tokenizer_config.json, if any
};

std::unique_ptr<Tokenizer> make_pipeline_tokenizer(Pipeline p, std::string name, SourceFiles files);

// Loaders (tokenizer_json.cpp, gpt2_files.cpp); each throws UserError naming the file.
Pipeline parse_tokenizer_json(const std::string& path, const std::string& text);
Pipeline parse_gpt2_files(const std::string& vocab_path, const std::string& vocab_text,
                          const std::string& merges_path, const std::string& merges_text);
// eos/bos from a tokenizer_config.json text (a string or {"content": ...}), else the usual
// names among the added tokens and the vocabulary.
void choose_special_ids(Pipeline& p, const std::string& config_text);

// FNV-1a 64 as 16 hex digits.
std::string fnv1a_hex(std::string_view bytes);
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(std::string_view s);
  void add_field(std::string_view s);  // with its length first, so fields cannot run together
  std::string hex() const;
};

}  // namespace runner::tok
