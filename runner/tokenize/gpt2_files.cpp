// GPT-2's own files (vocab.json + merges.txt, or their original names encoder.json +
// vocab.bpe) as the same Pipeline a GPT-2 tokenizer.json gives: ByteLevel with the GPT-2
// split, <|endoftext|> as a special token, and the ByteLevel decoder. Also the choice of the
// end- and beginning-of-text tokens for every pipeline.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/tokenize/stages.h"

namespace runner::tok {

namespace {

std::vector<std::pair<std::string, std::string>> read_merges(const std::string& path, const std::string& text) {
  std::vector<std::pair<std::string, std::string>> merges;
  int line = 0;
  std::string raw_a, raw_b;
  for (size_t i = 0; i < text.size();) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    std::string l = text.substr(i, e - i);
    i = e + 1;
    ++line;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.empty() || (line == 1 && l.rfind("#version", 0) == 0)) continue;
    const size_t sp = l.find(' ');
    if (sp == std::string::npos || l.find(' ', sp + 1) != std::string::npos)
      throw UserError({path, line, 1}, "a merge line must be two tokens separated by one space, not '" + l + "'", "the merges file is damaged; copy it again");
    if (!alias_to_bytes(l.substr(0, sp), raw_a) || !alias_to_bytes(l.substr(sp + 1), raw_b))
      throw UserError({path, line, 1}, "'" + l + "' is not written in GPT-2's byte alphabet", "give the merges.txt/vocab.bpe of a byte-level BPE");
    merges.emplace_back(raw_a, raw_b);
  }
  return merges;
}

}  // namespace

Pipeline parse_gpt2_files(const std::string& vocab_path, const std::string& vocab_text, const std::string& merges_path,
                          const std::string& merges_text) {
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError({vocab_path, 0, 0}, std::string("not valid JSON: ") + e.what(), "the vocabulary file is damaged; copy it again");
  }
  if (!v.is_object() || v.empty()) throw UserError({vocab_path, 0, 0}, "not a JSON object of token -> id", "give GPT-2's vocab.json or encoder.json");
  std::vector<std::string> tokens;
  std::string raw;
  const int64_t bound = std::min<int64_t>(kMaxVocabIds, static_cast<int64_t>(v.size()) + kVocabIdSlack);
  for (const auto& [tok, id] : v.items()) {
    const bool big = id.is_number_unsigned() && id.get<uint64_t>() > INT64_MAX;
    if (!id.is_number_integer() || big || id.get<int64_t>() < 0 || id.get<int64_t>() >= bound)
      throw UserError({vocab_path, 0, 0}, "token '" + tok + "' has the id " + id.dump() + ", outside [0, " + std::to_string(bound) + ")",
                      "ids are integers below the count of entries plus " + std::to_string(kVocabIdSlack) + ", and below 2^24");
    const auto i = static_cast<size_t>(id.get<int64_t>());
    if (i >= tokens.size()) tokens.resize(i + 1);
    tokens[i] = alias_to_bytes(tok, raw) ? raw : tok;
  }
  Pipeline p;
  p.kind = "bpe-bytelevel";
  PreTokenizerStep bl{PreTokenizerStep::byte_level};
  bl.use_regex = true;
  p.pre_tokenizers.push_back(bl);
  p.decoders.push_back({DecoderStep::byte_level, "", ""});
  BpeOptions o;
  o.byte_level = true;
  try {
    p.bpe = std::make_unique<BpeModel>(tokens, read_merges(merges_path, merges_text), o);
  } catch (const std::invalid_argument& e) {
    throw UserError({merges_path, 0, 0}, e.what(), "the merges and the vocabulary " + vocab_path + " do not belong together");
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == "<|endoftext|>") p.added.push_back({tokens[i], static_cast<int32_t>(i), true});
  return p;
}

namespace {

// The id of a token named in tokenizer_config.json or by one of the usual names.
std::optional<int32_t> id_of(const Pipeline& p, const std::string& content) {
  for (const AddedToken& t : p.added)
    if (t.content == content) return t.id;
  if (p.bpe) {
    if (int32_t id = p.bpe->find(content); id >= 0) return id;
  } else {
    for (size_t i = 0; i < p.unigram->pieces().size(); ++i)
      if (p.unigram->pieces()[i].first == content) return static_cast<int32_t>(i);
  }
  return std::nullopt;
}

std::optional<int32_t> choose(const Pipeline& p, const nlohmann::json& cfg, const char* key, std::initializer_list<const char*> names) {
  if (cfg.is_object() && cfg.contains(key)) {
    const nlohmann::json& v = cfg[key];
    const std::string s = v.is_string() ? v.get<std::string>() : v.is_object() ? v.value("content", std::string()) : "";
    if (auto id = id_of(p, s)) return id;
  }
  for (const char* n : names)
    if (auto id = id_of(p, n)) return id;
  return std::nullopt;
}

}  // namespace

void choose_special_ids(Pipeline& p, const std::string& config_text) {
  const nlohmann::json cfg = config_text.empty() ? nlohmann::json() : nlohmann::json::parse(config_text, nullptr, false);
  p.eos = choose(p, cfg, "eos_token", {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"});
  p.bos = choose(p, cfg, "bos_token", {"<s>", "<|begin_of_text|>", "<bos>"});
}

}  // namespace runner::tok
