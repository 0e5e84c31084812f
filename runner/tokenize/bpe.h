// The BPE model: a word's symbols merged pair by pair in the order of the merge list (the
// lowest-ranked adjacent pair first, the leftmost of equal pairs first), as GPT-2's bpe()
// and Hugging Face's BPE model do.
//
// Byte-level models (GPT-2, Llama 3) start from the word's bytes; the vocabulary is kept as
// raw bytes (GPT-2's printable byte alias characters are undone at load), so decoding is a
// concatenation. SentencePiece-style models (Llama 2, Mistral) start from the word's UTF-8
// characters, with unknown characters spelt as <0xXX> byte tokens (byte_fallback) or as the
// unknown token. Each thread keeps a cache of the words it has seen (encode is const and
// thread-safe); words of more than a few dozen symbols merge through a priority queue.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace runner::tok {

// Transparent hashing so a std::string-keyed map is searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// GPT-2's byte <-> printable character table (bytes_to_unicode in openai/gpt-2's encoder.py).
const std::array<uint32_t, 256>& byte_to_alias();
// A vocabulary entry written in alias characters, back to raw bytes; false if a character
// is not an alias.
bool alias_to_bytes(std::string_view token, std::string& out);

// "▁" (U+2581), SentencePiece's visible space.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

struct BpeOptions {
  bool byte_level = false;    // symbols start as bytes (else as UTF-8 characters)
  bool byte_fallback = false; // unknown characters become <0xXX> tokens
  bool fuse_unk = false;      // consecutive unknown characters give one unknown token
  bool ignore_merges = false; // a word that is itself in the vocabulary is that token
  // Every merge ranks as the first merge giving the same token: pairs that give one token tie
  // and the leftmost goes first, as SentencePiece's BPE picks by the merged piece's score.
  bool rank_by_result = false;
  int32_t unk_id = -1;
};

class BpeModel {
 public:
  // `tokens[id]`: the token's text (raw bytes for byte-level; empty where an id is unused);
  // `merges`: pairs of token texts, best first. Throws std::invalid_argument naming the
  // first merge whose parts or result are not in the vocabulary.
  BpeModel(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
           BpeOptions opt);
  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  const std::vector<std::string>& tokens() const { return tokens_; }
  int32_t find(std::string_view token) const;  // -1 when absent
  // The merges as (left id, right id) in rank order, for the hash.
  const std::vector<std::pair<int32_t, int32_t>>& merge_ids() const { return merge_list_; }
  const BpeOptions& options() const { return opt_; }

 private:
  struct Merge {
    int32_t rank, id;
  };
  const Merge* merge_of(int32_t a, int32_t b) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& syms) const;
  void merge_small(std::vector<int32_t>& syms) const;
  void merge_heap(std::vector<int32_t>& syms) const;
  void encode_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void encode_cached(std::string_view word, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  StringMap<int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<std::pair<int32_t, int32_t>> merge_list_;
  std::array<int32_t, 256> byte_ids_{};      // byte-level: the token of each byte
  std::array<int32_t, 256> fallback_ids_{};  // byte_fallback: <0xXX>
  // Where a long word may be cut before merging (no token spans the cut, so merges never
  // cross it): before every ▁ when no token holds ▁ but at its start; else before every ▁
  // that follows another character when no token holds one followed by ▁ (SentencePiece
  // with whitespace-only pieces, as Llama 2); else nowhere.
  enum class Cut { every_metaspace, metaspace_after_other, none } cut_ = Cut::none;
  BpeOptions opt_;
  uint64_t serial_;  // names this model in the per-thread caches
};

}  // namespace runner::tok
