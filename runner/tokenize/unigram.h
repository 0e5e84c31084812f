// The Unigram model (SentencePiece's, as Hugging Face runs it): the segmentation of a word
// into vocabulary pieces with the highest total log-probability (Viterbi over a trie), an
// unknown character scoring the lowest piece score minus 10, consecutive unknown characters
// fused into one unknown token, or spelt as <0xXX> tokens with byte_fallback.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace runner::tok {

class UnigramModel {
 public:
  UnigramModel(std::vector<std::pair<std::string, double>> pieces, int32_t unk_id, bool byte_fallback);
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  const std::vector<std::pair<std::string, double>>& pieces() const { return pieces_; }
  int32_t unk_id() const { return unk_id_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  void viterbi(std::string_view word, std::vector<int32_t>& out) const;
  int32_t child(int32_t node, unsigned char b) const;

  std::vector<std::pair<std::string, double>> pieces_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<int32_t> node_piece_;              // the piece a trie node ends, or -1
  std::array<int32_t, 256> fallback_ids_{};
  int32_t unk_id_;
  bool byte_fallback_;
  bool split_at_metaspace_ = true;
  double unk_score_ = 0;
};

}  // namespace runner::tok
