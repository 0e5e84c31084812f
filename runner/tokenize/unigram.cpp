// Unigram Viterbi: a forward pass over character boundaries keeps the best score ending at
// each; pieces starting at a boundary come from walking the byte trie. Scores add in double
// and ties keep the first path found (starts left to right, shorter pieces first), as
// Hugging Face's Unigram does. (SentencePiece adds in float32, so between segmentations of
// exactly equal score, e.g. of a run of spaces, the two may choose differently.)
#include "runner/tokenize/unigram.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "runner/tokenize/bpe.h"
#include "runner/tokenize/unicode.h"

namespace runner::tok {

UnigramModel::UnigramModel(std::vector<std::pair<std::string, double>> pieces, int32_t unk_id, bool byte_fallback)
    : pieces_(std::move(pieces)), unk_id_(unk_id), byte_fallback_(byte_fallback) {
  double min_score = std::numeric_limits<double>::infinity();
  node_piece_.push_back(-1);
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const std::string& p = pieces_[id].first;
    min_score = std::min(min_score, pieces_[id].second);
    if (p.empty()) continue;
    if (p.find(kMetaspace, 1) != std::string::npos) split_at_metaspace_ = false;
    int32_t node = 0;
    for (unsigned char b : p) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, static_cast<int32_t>(node_piece_.size())).first;
        node_piece_.push_back(-1);
      }
      node = it->second;
    }
    if (node_piece_[node] < 0) node_piece_[node] = static_cast<int32_t>(id);
  }
  unk_score_ = min_score - 10.0;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    fallback_ids_[b] = -1;
    int32_t node = 0;
    for (const char* c = buf; *c && node >= 0; ++c) node = child(node, static_cast<unsigned char>(*c));
    if (node >= 0) fallback_ids_[b] = node_piece_[node];
  }
}

int32_t UnigramModel::child(int32_t node, unsigned char b) const {
  auto it = edges_.find((static_cast<uint64_t>(node) << 8) | b);
  return it == edges_.end() ? -1 : it->second;
}

void UnigramModel::viterbi(std::string_view w, std::vector<int32_t>& out) const {
  struct Best {
    double score = -std::numeric_limits<double>::infinity();
    int32_t start = -1, id = -1;
  };
  std::vector<Best> best(w.size() + 1);
  best[0].score = 0;
  for (size_t i = 0; i < w.size();) {
    const auto clen = static_cast<size_t>(unicode::decode(w, i).len);
    if (best[i].start < 0 && i > 0) { i += clen; continue; }
    bool single = false;
    int32_t node = 0;
    for (size_t j = i; j < w.size() && node >= 0;) {
      node = child(node, static_cast<unsigned char>(w[j++]));
      if (node < 0 || node_piece_[node] < 0) continue;
      const int32_t id = node_piece_[node];
      const double s = best[i].score + pieces_[id].second;
      if (best[j].start < 0 || s > best[j].score) best[j] = {s, static_cast<int32_t>(i), id};
      single = single || j == i + clen;
    }
    if (!single) {
      const double s = best[i].score + unk_score_;
      if (best[i + clen].start < 0 || s > best[i + clen].score) best[i + clen] = {s, static_cast<int32_t>(i), -1};
    }
    i += clen;
  }
  std::vector<std::pair<int32_t, int32_t>> path;  // (id or -1 for unknown, start)
  for (size_t e = w.size(); e > 0; e = static_cast<size_t>(best[e].start)) path.emplace_back(best[e].id, best[e].start);
  std::reverse(path.begin(), path.end());
  for (size_t k = 0; k < path.size(); ++k) {
    if (path[k].first >= 0) { out.push_back(path[k].first); continue; }
    size_t end = k + 1 < path.size() ? static_cast<size_t>(path[k + 1].second) : w.size();
    if (byte_fallback_) {
      for (size_t b = static_cast<size_t>(path[k].second); b < end; ++b) {
        const int32_t id = fallback_ids_[static_cast<unsigned char>(w[b])];
        out.push_back(id >= 0 ? id : unk_id_);
      }
    } else if (unk_id_ >= 0 && !(k > 0 && path[k - 1].first < 0)) {
      out.push_back(unk_id_);  // a run of unknown characters is one unknown token
    }
  }
}

void UnigramModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (!split_at_metaspace_) return viterbi(word, out);
  // No piece holds ▁ but at its start, so the best path splits before every ▁: each part's
  // Viterbi alone gives the same ids with less work.
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.find(kMetaspace, start + 1);
    if (end == std::string_view::npos) end = word.size();
    viterbi(word.substr(start, end - start), out);
    start = end;
  }
}

}  // namespace runner::tok
