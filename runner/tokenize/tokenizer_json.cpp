// Hugging Face tokenizer.json -> Pipeline. Every stage kind GPT-2, Llama 2/3 and Mistral use
// is read; any other is refused with a UserError naming it (never silently different ids).
#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/tokenize/stages.h"

namespace runner::tok {

namespace {

using nlohmann::json;

struct Ctx {
  const std::string& path;
  int64_t id_bound = kMaxVocabIds;  // ids must be below this (set from the file's size below)
  [[noreturn]] void refuse(const std::string& what, const std::string& fix) const { throw UserError({path, 0, 0}, what, fix); }
};

std::string str(const json& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : dflt;
}
bool flag(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : dflt;
}

// A Replace/Split pattern: {"String": s} or {"Regex": r}.
std::string pattern_string(const Ctx& c, const json& step, bool& is_regex) {
  const json& p = step.value("pattern", json::object());
  is_regex = p.contains("Regex");
  if (p.contains("String")) return p["String"].get<std::string>();
  if (is_regex) return p["Regex"].get<std::string>();
  c.refuse(step.value("type", std::string("?")) + " has no pattern", "give it {\"String\": ...} or {\"Regex\": ...}");
}

// Sequence stages flattened into one list.
std::vector<json> flatten(const json& j, const char* list_key) {
  std::vector<json> out;
  if (j.is_null()) return out;
  if (str(j, "type") == "Sequence") {
    for (const json& s : j.value(list_key, json::array())) {
      auto sub = flatten(s, list_key);
      out.insert(out.end(), sub.begin(), sub.end());
    }
  } else {
    out.push_back(j);
  }
  return out;
}

void read_normalizers(const Ctx& c, const json& j, Pipeline& p) {
  for (const json& s : flatten(j, "normalizers")) {
    const std::string type = str(s, "type");
    bool regex = false;
    if (type == "Prepend") p.normalizers.push_back({NormalizerStep::prepend, str(s, "prepend"), ""});
    else if (type == "Replace") {
      std::string from = pattern_string(c, s, regex);
      if (regex) c.refuse("normalizer Replace with the regex '" + from + "' is not supported", "runner implements Replace with a {\"String\": ...} pattern");
      p.normalizers.push_back({NormalizerStep::replace, from, str(s, "content")});
    } else if (type == "Strip") {
      p.normalizers.push_back({NormalizerStep::strip, "", "", flag(s, "strip_left", true), flag(s, "strip_right", true)});
    } else if (type == "Precompiled" && str(s, "precompiled_charsmap").empty()) {
      continue;  // an empty SentencePiece normalization map changes nothing
    } else {
      c.refuse("normalizer '" + type + "' is not supported",
               "runner implements Prepend, Replace (string patterns), Strip and an empty Precompiled map (no Unicode "
               "normalization such as NFKC); for a SentencePiece model load its tokenizer.model instead");
    }
  }
}

PreTokenizerStep::Prepend prepend_scheme(const Ctx& c, const json& s) {
  if (s.contains("prepend_scheme")) {
    const std::string v = str(s, "prepend_scheme");
    if (v == "always") return PreTokenizerStep::always;
    if (v == "first") return PreTokenizerStep::first;
    if (v == "never") return PreTokenizerStep::never;
    c.refuse("Metaspace prepend_scheme '" + v + "' is unknown", "use always, first or never");
  }
  return flag(s, "add_prefix_space", true) ? PreTokenizerStep::always : PreTokenizerStep::never;
}

void read_pre_tokenizers(const Ctx& c, const json& j, Pipeline& p) {
  for (const json& s : flatten(j, "pretokenizers")) {
    const std::string type = str(s, "type");
    PreTokenizerStep step{PreTokenizerStep::split};
    if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::byte_level;
      step.use_regex = flag(s, "use_regex", true);
      step.add_prefix_space = flag(s, "add_prefix_space", false);
    } else if (type == "Split") {
      bool regex = false;
      const std::string pat = pattern_string(c, s, regex);
      const auto known = recognise_pattern(pat);
      if (!known) c.refuse("Split pattern '" + pat + "' is not supported", "runner implements the GPT-2, Llama 3 and Qwen2 split patterns");
      if (str(s, "behavior") != "Isolated" || flag(s, "invert", false))
        c.refuse("Split behavior '" + str(s, "behavior") + "' (invert " + (flag(s, "invert", false) ? "true" : "false") + ") is not supported", "runner implements behavior Isolated, invert false");
      step.pattern = *known;
    } else if (type == "Metaspace") {
      step.kind = PreTokenizerStep::metaspace;
      step.replacement = str(s, "replacement", std::string(kMetaspace));
      step.prepend = prepend_scheme(c, s);
      step.split_words = flag(s, "split", true);
    } else {
      c.refuse("pre-tokenizer '" + type + "' is not supported", "runner implements ByteLevel, Split (GPT-2, Llama 3 and Qwen2 patterns) and Metaspace");
    }
    p.pre_tokenizers.push_back(step);
  }
}

void read_decoders(const Ctx& c, const json& j, Pipeline& p) {
  for (const json& s : flatten(j, "decoders")) {
    const std::string type = str(s, "type");
    bool regex = false;
    if (type == "Replace") {
      DecoderStep d{DecoderStep::replace, pattern_string(c, s, regex), str(s, "content")};
      if (regex) c.refuse("decoder Replace with a regex is not supported", "use a {\"String\": ...} pattern");
      p.decoders.push_back(d);
    } else if (type == "ByteFallback") p.decoders.push_back({DecoderStep::byte_fallback, "", ""});
    else if (type == "Fuse") p.decoders.push_back({DecoderStep::fuse, "", ""});
    else if (type == "ByteLevel") p.decoders.push_back({DecoderStep::byte_level, "", ""});
    else if (type == "Strip") {
      p.decoders.push_back({DecoderStep::strip, str(s, "content", " "), "", s.value("start", 0), s.value("stop", 0)});
    } else if (type == "Metaspace") {
      DecoderStep d{DecoderStep::metaspace, str(s, "replacement", std::string(kMetaspace)), ""};
      d.prepend = prepend_scheme(c, s) != PreTokenizerStep::never;
      p.decoders.push_back(d);
    } else {
      c.refuse("decoder '" + type + "' is not supported", "runner implements Replace, ByteFallback, Fuse, Strip, ByteLevel and Metaspace");
    }
  }
}

void check_id(const Ctx& c, const std::string& what, int64_t id);

// A vocabulary entry as the model stores it: raw bytes for byte-level models.
std::string model_text(const std::string& t, bool byte_level) {
  std::string raw;
  return byte_level && alias_to_bytes(t, raw) ? raw : t;
}

std::pair<std::string, std::string> merge_pair(const Ctx& c, const json& m, size_t k) {
  if (m.is_array() && m.size() == 2) return {m[0].get<std::string>(), m[1].get<std::string>()};
  const std::string s = m.is_string() ? m.get<std::string>() : "";
  const size_t sp = s.find(' ');
  if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
    c.refuse("model.merges[" + std::to_string(k) + "] is not a pair (\"a b\" or [\"a\", \"b\"])", "regenerate the tokenizer.json");
  return {s.substr(0, sp), s.substr(sp + 1)};
}

void read_bpe(const Ctx& c, const json& m, bool byte_level, Pipeline& p) {
  if (!str(m, "continuing_subword_prefix").empty() || !str(m, "end_of_word_suffix").empty())
    c.refuse("BPE with a continuing_subword_prefix or end_of_word_suffix is not supported", "runner implements GPT-2 and SentencePiece-style BPE");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    c.refuse("BPE dropout is set", "set model.dropout to null for encoding");
  std::vector<std::string> tokens;
  for (const auto& [tok, id] : m.at("vocab").items()) {
    if (!id.is_number_integer()) c.refuse("model.vocab['" + tok + "'] has the id " + id.dump() + ", not an integer", "ids are integers in [0, vocabulary size)");
    const auto i = id.is_number_unsigned() && id.get<uint64_t>() > INT64_MAX ? INT64_MAX : id.get<int64_t>();
    check_id(c, "model.vocab['" + tok + "']", i);
    if (static_cast<size_t>(i) >= tokens.size()) tokens.resize(static_cast<size_t>(i) + 1);
    tokens[static_cast<size_t>(i)] = model_text(tok, byte_level);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& ml = m.value("merges", json::array());
  for (size_t k = 0; k < ml.size(); ++k) {
    auto [a, b] = merge_pair(c, ml[k], k);
    merges.emplace_back(model_text(a, byte_level), model_text(b, byte_level));
  }
  BpeOptions o;
  o.byte_level = byte_level;
  o.byte_fallback = flag(m, "byte_fallback", false);
  o.fuse_unk = flag(m, "fuse_unk", false);
  o.ignore_merges = flag(m, "ignore_merges", false);
  const std::string unk = model_text(str(m, "unk_token"), byte_level);
  for (size_t i = 0; i < tokens.size() && !unk.empty(); ++i)
    if (tokens[i] == unk) o.unk_id = static_cast<int32_t>(i);
  try {
    p.bpe = std::make_unique<BpeModel>(std::move(tokens), merges, o);
  } catch (const std::invalid_argument& e) {
    c.refuse(std::string("model: ") + e.what(), "the vocabulary and merges do not belong together; regenerate the file");
  }
}

void read_unigram(const Ctx& c, const json& m, Pipeline& p) {
  std::vector<std::pair<std::string, double>> pieces;
  for (const json& e : m.at("vocab")) {
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
      c.refuse("model.vocab[" + std::to_string(pieces.size()) + "] is " + e.dump().substr(0, 80) + ", not [piece, score]", "regenerate the tokenizer.json");
    pieces.emplace_back(e[0].get<std::string>(), e[1].get<double>());
    if (static_cast<int64_t>(pieces.size()) > kMaxVocabIds) check_id(c, "model.vocab", static_cast<int64_t>(pieces.size()));
  }
  if (pieces.empty()) c.refuse("the Unigram model's vocabulary is empty", "give a tokenizer.json whose model.vocab lists its pieces");
  int32_t unk = -1;
  if (m.contains("unk_id") && !m["unk_id"].is_null()) {
    const json& u = m["unk_id"];
    if (!u.is_number_integer() || u.get<double>() < 0 || u.get<double>() >= static_cast<double>(pieces.size()))
      c.refuse("model.unk_id is " + u.dump() + ", outside the vocabulary of " + std::to_string(pieces.size()) + " pieces",
               "set unk_id to the id of the unknown piece, or null");
    unk = u.get<int32_t>();
  }
  p.unigram = std::make_unique<UnigramModel>(std::move(pieces), unk, flag(m, "byte_fallback", false));
}

// Every id a file names is checked here before anything is sized by it: a negative id, one
// beyond int32 or one far past the entries the file holds is refused with the value.
void check_id(const Ctx& c, const std::string& what, int64_t id) {
  if (id < 0 || id >= c.id_bound)
    c.refuse(what + " has the id " + std::to_string(id) + ", outside [0, " + std::to_string(c.id_bound) + ")",
             "ids must be below the count of entries and added tokens plus " + std::to_string(kVocabIdSlack) + ", and below 2^24");
}

// line:col of a byte offset, for parse errors.
SourceLoc where(const std::string& path, const std::string& text, size_t byte) {
  int line = 1, col = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) {
    if (text[i] == '\n') ++line, col = 1;
    else ++col;
  }
  return {path, line, col};
}

}  // namespace

Pipeline parse_tokenizer_json(const std::string& path, const std::string& text) {
  Ctx c{path};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw UserError(where(path, text, e.byte), std::string("not valid JSON: ") + e.what(), "the tokenizer.json is damaged; copy it again");
  }
  if (!j.is_object() || !j.contains("model")) c.refuse("no \"model\" object: not a Hugging Face tokenizer.json", "give a tokenizer.json saved by Hugging Face tokenizers");
  Pipeline p;
  try {
    const json& m = j["model"];
    const json& vocab = m.value("vocab", json());
    const json& added = j.value("added_tokens", json::array());
    const int64_t entries = (vocab.is_object() || vocab.is_array() ? static_cast<int64_t>(vocab.size()) : 0) +
                            (added.is_array() ? static_cast<int64_t>(added.size()) : 0);
    c.id_bound = std::min<int64_t>(kMaxVocabIds, entries + kVocabIdSlack);
    read_normalizers(c, j.value("normalizer", json()), p);
    read_pre_tokenizers(c, j.value("pre_tokenizer", json()), p);
    read_decoders(c, j.value("decoder", json()), p);
    bool byte_level = false;
    for (const auto& s : p.pre_tokenizers) byte_level = byte_level || s.kind == PreTokenizerStep::byte_level;
    const std::string type = str(m, "type", m.contains("merges") ? "BPE" : "");
    if (type == "BPE") read_bpe(c, m, byte_level, p);
    else if (type == "Unigram") read_unigram(c, m, p);
    else c.refuse("model type '" + type + "' is not supported", "runner implements BPE and Unigram models (not WordPiece or WordLevel)");
    p.kind = type == "Unigram" ? "unigram" : byte_level ? "bpe-bytelevel" : "bpe";
    for (const json& t : added) {
      const json& id = t.at("id");
      const std::string what = "added_tokens '" + str(t, "content") + "'";
      if (!id.is_number_integer()) c.refuse(what + " has the id " + id.dump() + ", not an integer", "ids are integers in [0, vocabulary size)");
      check_id(c, what, id.is_number_unsigned() && id.get<uint64_t>() > INT64_MAX ? INT64_MAX : id.get<int64_t>());
      p.added.push_back({str(t, "content"), id.get<int32_t>(), flag(t, "special", false)});
    }
  } catch (const json::exception& e) {
    c.refuse(std::string("unexpected structure: ") + e.what(), "give a tokenizer.json saved by Hugging Face tokenizers");
  }
  return p;
}

}  // namespace runner::tok
