// The pipeline tokenizer: added tokens are cut out first (leftmost, longest), every other
// segment is normalized, pre-tokenized and handed word by word to the model; decoding maps
// ids to token texts and runs the decoders over the list, as Hugging Face's tokenizers do.
// Per-call scratch lives in thread_local buffers so encode stays const and thread-safe.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/tokenize/stages.h"
#include "runner/tokenize/unicode.h"

namespace runner::tok {

void Fnv::add(std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
}
void Fnv::add_field(std::string_view s) {
  add(std::to_string(s.size()) + ":");
  add(s);
}
std::string Fnv::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
std::string fnv1a_hex(std::string_view bytes) {
  Fnv f;
  f.add(bytes);
  return f.hex();
}

namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) out.append(s, i, j - i).append(to);
  out.append(s, i, std::string::npos);
  s.swap(out);
}

// Unicode White_Space at either end (Rust's char::is_whitespace, which the Strip normalizer uses).
void strip_space(std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e) {
    const unicode::Decoded d = unicode::decode(s, b);
    if (!unicode::is_space(d.cp)) break;
    b += static_cast<size_t>(d.len);
  }
  while (right && e > b) {
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (!unicode::is_space(unicode::decode(s, k).cp)) break;
    e = k;
  }
  s = s.substr(b, e - b);
}

class PipelineTokenizer final : public Tokenizer {
 public:
  PipelineTokenizer(Pipeline p, std::string name, SourceFiles files)
      : p_(std::move(p)), name_(std::move(name)), files_(std::move(files)) {
    for (size_t k = 0; k < p_.added.size(); ++k) {
      const AddedToken& t = p_.added[k];
      if (t.content.empty()) continue;
      by_first_[static_cast<unsigned char>(t.content[0])].push_back(k);
      by_id_.emplace(t.id, k);
      vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
    }
    for (auto& v : by_first_)
      std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) { return p_.added[a].content.size() > p_.added[b].content.size(); });
    vocab_size_ = std::max<int64_t>(vocab_size_, p_.bpe ? p_.bpe->tokens().size() : p_.unigram->pieces().size());
    hash_ = compute_hash();
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    encode_part(text, EncodeOptions{}, out);
    return out;
  }
  int64_t encode_part(std::string_view text, const EncodeOptions& o, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  TokenizerInfo info() const override { return {p_.kind, name_, vocab_size_, hash_}; }
  std::optional<int32_t> eos_id() const override { return p_.eos; }
  std::optional<int32_t> bos_id() const override { return p_.bos; }
  void save(const std::string& dir) const override;

 private:
  void encode_segment(std::string_view seg, bool at_start, std::vector<int32_t>& out) const;
  void pre_tokenize(const PreTokenizerStep& s, std::string_view piece, bool at_start, std::vector<std::string_view>& out,
                    std::deque<std::string>& store) const;
  std::string token_text(int32_t id) const;
  std::string compute_hash() const;

  Pipeline p_;
  std::string name_;
  SourceFiles files_;
  std::vector<size_t> by_first_[256];  // added tokens by first byte, longest first
  std::unordered_map<int32_t, size_t> by_id_;
  int64_t vocab_size_ = 0;
  std::string hash_;
};

int64_t PipelineTokenizer::encode_part(std::string_view text, const EncodeOptions& o, std::vector<int32_t>& out) const {
  out.reserve(out.size() + text.size() / 3 + 8);
  const bool first = !o.continues;
  int64_t specials = 0;
  size_t seg = 0;
  for (size_t i = 0; i < text.size() && !p_.added.empty(); ++i) {
    for (size_t k : by_first_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& t = p_.added[k];
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      if (t.special) ++specials;
      if (t.special && o.special_as_text) continue;  // a shorter, non-special added token may still match here
      if (i > seg) encode_segment(text.substr(seg, i - seg), first && seg == 0, out);
      out.push_back(t.id);
      seg = i + t.content.size();
      i = seg - 1;
      break;
    }
  }
  if (seg < text.size()) encode_segment(text.substr(seg), first && seg == 0, out);
  return specials;
}

void PipelineTokenizer::encode_segment(std::string_view seg, bool at_start, std::vector<int32_t>& out) const {
  thread_local std::string norm;
  std::string_view text = seg;
  if (!p_.normalizers.empty()) {
    norm.assign(seg);
    for (const NormalizerStep& n : p_.normalizers) {
      if (n.kind == NormalizerStep::prepend && !norm.empty()) norm.insert(0, n.a);
      if (n.kind == NormalizerStep::replace) replace_all(norm, n.a, n.b);
      if (n.kind == NormalizerStep::strip) strip_space(norm, n.left, n.right);
    }
    text = norm;
  }
  thread_local std::vector<std::string_view> a, b;
  thread_local std::deque<std::string> store;
  store.clear();
  a.assign(1, text);
  for (const PreTokenizerStep& s : p_.pre_tokenizers) {
    b.clear();
    for (size_t k = 0; k < a.size(); ++k) pre_tokenize(s, a[k], at_start && k == 0, b, store);
    a.swap(b);
  }
  for (std::string_view w : a) {
    if (w.empty()) continue;
    if (p_.bpe) p_.bpe->encode_word(w, out);
    else p_.unigram->encode_word(w, out);
  }
}

void PipelineTokenizer::pre_tokenize(const PreTokenizerStep& s, std::string_view piece, bool at_start,
                                     std::vector<std::string_view>& out, std::deque<std::string>& store) const {
  if (s.kind == PreTokenizerStep::split) return split_pieces(s.pattern, piece, out);
  if (s.kind == PreTokenizerStep::byte_level) {
    if (s.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece = store.emplace_back(" " + std::string(piece));
    if (s.use_regex) return split_pieces(s.pattern, piece, out);
    return out.push_back(piece);
  }
  std::string r(piece);  // metaspace
  replace_all(r, " ", s.replacement);
  const bool prepend = s.prepend == PreTokenizerStep::always || (s.prepend == PreTokenizerStep::first && at_start);
  if (prepend && r.compare(0, s.replacement.size(), s.replacement) != 0) r.insert(0, s.replacement);
  const std::string_view w = store.emplace_back(std::move(r));
  if (!s.split_words || s.replacement.empty()) return out.push_back(w);
  size_t start = 0;  // each replacement begins a word (Hugging Face's MergedWithNext)
  while (start < w.size()) {
    size_t end = w.find(s.replacement, start + 1);
    if (end == std::string_view::npos) end = w.size();
    out.push_back(w.substr(start, end - start));
    start = end;
  }
}

std::string PipelineTokenizer::token_text(int32_t id) const {
  if (auto it = by_id_.find(id); it != by_id_.end()) return p_.added[it->second].content;
  if (id < 0) return "";
  if (p_.bpe) return static_cast<size_t>(id) < p_.bpe->tokens().size() ? p_.bpe->tokens()[id] : "";
  return static_cast<size_t>(id) < p_.unigram->pieces().size() ? p_.unigram->pieces()[id].first : "";
}

// <0xXX> -> the byte, or -1.
int fallback_byte(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  unsigned v = 0;
  for (char c : t.substr(3, 2)) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + static_cast<unsigned>(d);
  }
  return static_cast<int>(v);
}

// Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD each.
void byte_fallback(std::vector<std::string>& toks) {
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (unicode::valid_utf8(run)) out.push_back(run);
    else for (size_t k = 0; k < run_tokens; ++k) out.emplace_back("\xEF\xBF\xBD");
    run.clear();
    run_tokens = 0;
  };
  for (std::string& t : toks) {
    const int b = fallback_byte(t);
    if (b >= 0) {
      run.push_back(static_cast<char>(b));
      ++run_tokens;
      continue;
    }
    flush();
    out.push_back(std::move(t));
  }
  flush();
  toks.swap(out);
}

void apply_decoder(const DecoderStep& d, std::vector<std::string>& toks) {
  switch (d.kind) {
    case DecoderStep::replace:
      for (std::string& t : toks) replace_all(t, d.a, d.b);
      break;
    case DecoderStep::byte_fallback: byte_fallback(toks); break;
    case DecoderStep::fuse:
    case DecoderStep::byte_level: {  // byte-level tokens are kept as raw bytes: decoding joins them
      std::string all;
      for (const std::string& t : toks) all += t;
      toks.assign(1, std::move(all));
      break;
    }
    case DecoderStep::strip:
      for (std::string& t : toks) {
        int k = 0;
        size_t b = 0, e = t.size();
        while (k++ < d.start && b < e && t.compare(b, d.a.size(), d.a) == 0) b += d.a.size();
        k = 0;
        while (k++ < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0) e -= d.a.size();
        t = t.substr(b, e - b);
      }
      break;
    case DecoderStep::metaspace:
      for (size_t i = 0; i < toks.size(); ++i) {
        std::string& t = toks[i];
        if (i == 0 && d.prepend && t.compare(0, d.a.size(), d.a) == 0) t.erase(0, d.a.size());
        replace_all(t, d.a, " ");
      }
      break;
  }
}

std::string PipelineTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) toks.push_back(token_text(id));
  for (const DecoderStep& d : p_.decoders) apply_decoder(d, toks);
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

std::string PipelineTokenizer::compute_hash() const {
  Fnv f;
  f.add_field(p_.kind);
  for (const NormalizerStep& n : p_.normalizers)
    f.add_field("normalizer " + std::to_string(n.kind) + " " + n.a + "\x1f" + n.b + " " + std::to_string(n.left) + std::to_string(n.right));
  for (const PreTokenizerStep& s : p_.pre_tokenizers)
    f.add_field("pre " + std::to_string(s.kind) + " " + pattern_name(s.pattern) + " " + std::to_string(s.use_regex) +
                std::to_string(s.add_prefix_space) + " " + s.replacement + " " + std::to_string(s.prepend) + std::to_string(s.split_words));
  for (const DecoderStep& d : p_.decoders)
    f.add_field("decoder " + std::to_string(d.kind) + " " + d.a + "\x1f" + d.b + " " + std::to_string(d.start) + " " +
                std::to_string(d.stop) + std::to_string(d.prepend));
  if (p_.bpe) {
    const BpeOptions& o = p_.bpe->options();
    f.add_field("bpe " + std::to_string(o.byte_level) + std::to_string(o.byte_fallback) + std::to_string(o.fuse_unk) +
                std::to_string(o.ignore_merges) + " " + std::to_string(o.unk_id));
    for (const std::string& t : p_.bpe->tokens()) f.add_field(t);
    for (const auto& [l, r] : p_.bpe->merge_ids()) f.add_field(std::to_string(l) + " " + std::to_string(r));
  } else {
    f.add_field("unigram " + std::to_string(p_.unigram->unk_id()) + " " + std::to_string(p_.unigram->byte_fallback()));
    char buf[40];
    for (const auto& [piece, score] : p_.unigram->pieces()) {
      std::snprintf(buf, sizeof buf, "%.17g", score);
      f.add_field(piece);
      f.add_field(buf);
    }
  }
  for (const AddedToken& t : p_.added) f.add_field("added " + std::to_string(t.id) + " " + std::to_string(t.special) + " " + t.content);
  f.add_field("eos " + (p_.eos ? std::to_string(*p_.eos) : "-") + " bos " + (p_.bos ? std::to_string(*p_.bos) : "-"));
  return f.hex();
}

void PipelineTokenizer::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (const auto& [name, bytes] : files_.files) {
    std::ofstream f(fs::path(dir) / name, std::ios::binary);
    f << bytes;
    if (!f) throw UserError({(fs::path(dir) / name).string(), 0, 0}, "cannot write the tokenizer file", "check the directory's permissions and free space");
  }
  nlohmann::json cfg = nlohmann::json::object();
  if (!files_.config.empty()) cfg = nlohmann::json::parse(files_.config, nullptr, false);
  if (!cfg.is_object()) cfg = nlohmann::json::object();
  if (!cfg.contains("tokenizer_class"))
    cfg["tokenizer_class"] = files_.files.size() == 2 ? "GPT2Tokenizer" : "PreTrainedTokenizerFast";
  if (p_.eos) cfg["eos_token"] = token_text(*p_.eos);
  if (p_.bos) cfg["bos_token"] = token_text(*p_.bos);
  std::ofstream(fs::path(dir) / "tokenizer_config.json") << cfg.dump(2) << "\n";
}

}  // namespace

std::unique_ptr<Tokenizer> make_pipeline_tokenizer(Pipeline p, std::string name, SourceFiles files) {
  return std::make_unique<PipelineTokenizer>(std::move(p), std::move(name), std::move(files));
}

}  // namespace runner::tok
