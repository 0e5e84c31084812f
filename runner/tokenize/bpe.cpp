// BPE merging. Short words (most of them) merge with a linear scan for the best pair; long
// ones (a SentencePiece-style document without pre-tokenizer splits) through a min-heap of
// (rank, position) over a linked list of symbols, as Hugging Face's BPE does: both merge the
// lowest-ranked pair first and, among equal pairs, the leftmost, so both give the same ids.
#include "runner/tokenize/bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "runner/tokenize/unicode.h"

namespace runner::tok {

namespace {

std::atomic<uint64_t> g_serial{1};
constexpr size_t kSmallWord = 24;       // symbols; above this the heap is faster
constexpr size_t kCacheMaxWord = 256;   // bytes; longer words are not cached
constexpr size_t kCacheMaxEntries = 1 << 17;  // ~15 MB a thread: data prepare runs one per core

struct WordCache {
  uint64_t serial = 0;
  StringMap<std::vector<int32_t>> map;
};

// The calling thread's cache for the model `serial` (one model at a time per thread: a
// thread that switches models starts afresh).
WordCache& thread_cache(uint64_t serial) {
  thread_local WordCache cache;
  if (cache.serial != serial || cache.map.size() > kCacheMaxEntries) {
    cache.map.clear();
    cache.serial = serial;
  }
  return cache;
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

}  // namespace

const std::array<uint32_t, 256>& byte_to_alias() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : 256 + n++;
    }
    return t;
  }();
  return table;
}

bool alias_to_bytes(std::string_view token, std::string& out) {
  static const std::unordered_map<uint32_t, char> back = [] {
    std::unordered_map<uint32_t, char> m;
    for (uint32_t b = 0; b < 256; ++b) m[byte_to_alias()[b]] = static_cast<char>(b);
    return m;
  }();
  out.clear();
  for (size_t i = 0; i < token.size();) {
    const unicode::Decoded d = unicode::decode(token, i);
    auto it = back.find(d.cp);
    if (it == back.end()) return false;
    out.push_back(it->second);
    i += static_cast<size_t>(d.len);
  }
  return true;
}

BpeModel::BpeModel(std::vector<std::string> tokens, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions opt)
    : tokens_(std::move(tokens)), opt_(opt), serial_(g_serial.fetch_add(1)) {
  vocab_.reserve(tokens_.size());
  bool inner = false, after_other = false;  // some token holds ▁ past its start; after another character
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    if (t.empty()) continue;
    vocab_.emplace(t, static_cast<int32_t>(id));
    for (size_t k = t.find(kMetaspace, 1); k != std::string::npos; k = t.find(kMetaspace, k + 1)) {
      inner = true;
      after_other = after_other || k < kMetaspace.size() || t.compare(k - kMetaspace.size(), kMetaspace.size(), kMetaspace) != 0;
    }
  }
  if (!opt_.byte_level) cut_ = !inner ? Cut::every_metaspace : !after_other ? Cut::metaspace_after_other : Cut::none;
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = find(std::string(1, static_cast<char>(b)));
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    fallback_ids_[b] = find(name);
    if (opt_.byte_level && byte_ids_[b] < 0)
      throw std::invalid_argument("the byte-level vocabulary has no token for byte " + std::to_string(b));
  }
  merges_.reserve(merges.size());
  merge_list_.reserve(merges.size());
  std::unordered_map<int32_t, int32_t> first_rank;  // rank_by_result: token -> its first merge's rank
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const int32_t ia = find(a), ib = find(b), ic = find(a + b);
    if (ia < 0 || ib < 0 || ic < 0)
      throw std::invalid_argument("merge " + std::to_string(r + 1) + " ('" + a + "' '" + b + "'): " +
                                  (ia < 0 ? "'" + a + "'" : ib < 0 ? "'" + b + "'" : "their concatenation") +
                                  " is not in the vocabulary");
    // A repeated pair takes its last rank, as the references' dict/HashMap building does.
    int32_t rank = static_cast<int32_t>(r);
    if (opt_.rank_by_result) rank = first_rank.emplace(ic, rank).first->second;
    merges_.insert_or_assign(pair_key(ia, ib), Merge{rank, ic});
    merge_list_.emplace_back(ia, ib);
  }
}

int32_t BpeModel::find(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const BpeModel::Merge* BpeModel::merge_of(int32_t a, int32_t b) const {
  auto it = merges_.find(pair_key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  syms.clear();
  if (opt_.byte_level) {
    for (char c : word) syms.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    return;
  }
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const auto len = static_cast<size_t>(unicode::decode(word, i).len);
    const std::string_view ch = word.substr(i, len);
    i += len;
    if (const int32_t id = find(ch); id >= 0) {
      syms.push_back(id);
      last_unk = false;
      continue;
    }
    bool bytes_ok = opt_.byte_fallback;
    for (char c : ch) bytes_ok = bytes_ok && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
    if (bytes_ok) {
      for (char c : ch) syms.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
      last_unk = false;
    } else if (opt_.unk_id >= 0 && !(opt_.fuse_unk && last_unk)) {
      syms.push_back(opt_.unk_id);
      last_unk = true;
    }
  }
}

void BpeModel::merge_small(std::vector<int32_t>& syms) const {
  while (syms.size() > 1) {
    const Merge* best = nullptr;
    size_t at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const Merge* m = merge_of(syms[i], syms[i + 1]);
      if (m && (!best || m->rank < best->rank)) best = m, at = i;
    }
    if (!best) return;
    syms[at] = best->id;
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

void BpeModel::merge_heap(std::vector<int32_t>& syms) const {
  struct Item {
    int32_t rank, pos, id;
    bool operator>(const Item& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(syms.size());
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = merge_of(syms[pos], syms[next[pos]])) heap.push({m->rank, pos, m->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Item top = heap.top();
    heap.pop();
    const int32_t r = next[top.pos];
    if (syms[top.pos] < 0 || r < 0) continue;
    const Merge* m = merge_of(syms[top.pos], syms[r]);
    if (!m || m->id != top.id) continue;  // a stale entry: one side merged since
    syms[top.pos] = m->id;
    syms[r] = -1;
    next[top.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) syms[k++] = syms[i];
  syms.resize(k);
}

void BpeModel::encode_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (opt_.ignore_merges) {
    if (const int32_t id = find(word); id >= 0) return out.push_back(id);
  }
  thread_local std::vector<int32_t> syms;
  initial_symbols(word, syms);
  if (syms.size() <= kSmallWord) merge_small(syms);
  else merge_heap(syms);
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (cut_ != Cut::none && word.size() > kMetaspace.size()) {
    // The word's parts between cuts merge alone (and are cached), with the same result.
    size_t start = 0;
    while (start < word.size()) {
      size_t end = start;
      do {
        end = word.find(kMetaspace, end + 1);
      } while (end != std::string_view::npos && cut_ == Cut::metaspace_after_other && end >= kMetaspace.size() &&
               word.compare(end - kMetaspace.size(), kMetaspace.size(), kMetaspace) == 0);
      if (end == std::string_view::npos) end = word.size();
      encode_cached(word.substr(start, end - start), out);
      start = end;
    }
    return;
  }
  if (opt_.byte_level && word.size() == 1) return out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
  encode_cached(word, out);
}

void BpeModel::encode_cached(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kCacheMaxWord) return encode_uncached(word, out);
  WordCache& cache = thread_cache(serial_);
  auto it = cache.map.find(word);
  if (it == cache.map.end()) {
    std::vector<int32_t> ids;
    encode_uncached(word, ids);
    it = cache.map.emplace(std::string(word), std::move(ids)).first;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
}

}  // namespace runner::tok
