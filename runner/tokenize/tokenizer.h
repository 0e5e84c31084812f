// Tokenizers: text <-> token ids, the same ids as the reference implementations.
//
// One interface for every kind: the built-in byte tokenizer (vocabulary 256), GPT-2's
// byte-level BPE (vocab.json + merges.txt, encoder.json + vocab.bpe, or a Hugging Face
// tokenizer.json with a ByteLevel pre-tokenizer, as GPT-2 and Llama 3), SentencePiece-style
// BPE and Unigram models in a tokenizer.json (Llama 2, Mistral), and SentencePiece .model
// files (through libsentencepiece). load_tokenizer() recognises the kind from the files; a
// tokenizer saves itself as files load_tokenizer() and Hugging Face both read back, and its
// hash names its content (the dataset records it; a run checks it).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace runner::tok {

// What a dataset and a run record about the tokenizer (its identity, not its files).
struct TokenizerInfo {
  std::string kind;        // "byte", "bpe-bytelevel", "bpe", "unigram", "sentencepiece"
  std::string name;        // a readable name (the directory's or file's name, or "byte")
  int64_t vocab_size = 0;  // ids are in [0, vocab_size)
  std::string hash;        // hex digest of the defining content (the same files give the same hash)
  bool operator==(const TokenizerInfo&) const = default;
};

struct EncodeOptions {
  // The text continues a document whose earlier text ended with a newline (data prepare cuts
  // long files there): the marks a tokenizer puts at a text's start (SentencePiece's dummy
  // prefix) are left out, so the parts' ids joined are the whole document's.
  bool continues = false;
  // A special token's text in the input is encoded as ordinary text (tiktoken's encode and
  // OpenAI's encoder do so) rather than as the special id (Hugging Face's default).
  bool special_as_text = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Thread-safe: data prepare encodes from every core on one tokenizer.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // encode() with options, appending to `out`; returns how many times a special token's text
  // (<|endoftext|>, ...) occurs in `text`, whether it became the special id or, with
  // special_as_text, was encoded as ordinary text.
  virtual int64_t encode_part(std::string_view text, const EncodeOptions& o, std::vector<int32_t>& out) const {
    (void)o;
    const std::vector<int32_t> ids = encode(text);
    out.insert(out.end(), ids.begin(), ids.end());
    return 0;
  }
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual TokenizerInfo info() const = 0;
  // The end-of-document token data prepare appends after each document (GPT-2's
  // <|endoftext|>, SentencePiece's </s>); the byte tokenizer uses 0 (NUL, never in text).
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  // Writes the files that define it into `dir` (created if missing) in the layout Hugging
  // Face loads (tokenizer.json and/or vocab.json + merges.txt, tokenizer.model,
  // tokenizer_config.json), so load_tokenizer(dir) gives the same ids and the same hash.
  virtual void save(const std::string& dir) const = 0;
};

// "byte" (or an empty string) gives the byte tokenizer; otherwise `path` is a directory
// holding tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe or
// tokenizer.model, or one such file. Throws UserError naming the path and what was expected.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The built-in byte tokenizer (ids are the UTF-8 bytes; vocabulary 256).
std::unique_ptr<Tokenizer> byte_tokenizer();

}  // namespace runner::tok
