// load_tokenizer: recognises the kind of tokenizer from its files. A directory is searched
// in Hugging Face's order of preference (tokenizer.json, the GPT-2 pairs, tokenizer.model);
// a file is taken by its name. Every failure names the file and what was expected.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/tokenize/sentencepiece.h"
#include "runner/tokenize/stages.h"
#include "runner/tokenize/tokenizer.h"

namespace runner::tok {

namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UserError({p.string(), 0, 0}, "cannot read the tokenizer file", "check that it exists and is readable");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw UserError({p.string(), 0, 0}, "cannot read the tokenizer file", "check that it is readable");
  return ss.str();
}

std::string read_if_exists(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) ? read_file(p) : std::string();
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const fs::path& file, const std::string& name) {
  SourceFiles src;
  src.files.emplace_back("tokenizer.json", read_file(file));
  src.config = read_if_exists(file.parent_path() / "tokenizer_config.json");
  Pipeline p = parse_tokenizer_json(file.string(), src.files[0].second);
  choose_special_ids(p, src.config);
  return make_pipeline_tokenizer(std::move(p), name, std::move(src));
}

// vocab.json + merges.txt, or GPT-2's original encoder.json + vocab.bpe; saved under the
// names Hugging Face reads.
std::unique_ptr<Tokenizer> from_gpt2_pair(const fs::path& vocab, const fs::path& merges, const std::string& name) {
  std::error_code ec;
  if (!fs::is_regular_file(merges, ec))
    throw UserError({merges.string(), 0, 0}, "missing: " + vocab.filename().string() + " needs its merges file beside it",
                    "put " + merges.filename().string() + " in the same directory");
  SourceFiles src;
  src.files.emplace_back("vocab.json", read_file(vocab));
  src.files.emplace_back("merges.txt", read_file(merges));
  src.config = read_if_exists(vocab.parent_path() / "tokenizer_config.json");
  Pipeline p = parse_gpt2_files(vocab.string(), src.files[0].second, merges.string(), src.files[1].second);
  choose_special_ids(p, src.config);
  return make_pipeline_tokenizer(std::move(p), name, std::move(src));
}

std::unique_ptr<Tokenizer> from_file(const fs::path& file, const std::string& name) {
  const std::string fname = file.filename().string();
  if (fname == "vocab.json") return from_gpt2_pair(file, file.parent_path() / "merges.txt", name);
  if (fname == "encoder.json") return from_gpt2_pair(file, file.parent_path() / "vocab.bpe", name);
  if (file.extension() == ".model") return load_sentencepiece(file.string(), read_file(file), name);
  if (file.extension() == ".json") return from_tokenizer_json(file, name);
  throw UserError({file.string(), 0, 0}, "not a tokenizer file I know",
                  "give tokenizer.json, vocab.json (+ merges.txt), encoder.json (+ vocab.bpe), a SentencePiece .model, or a directory holding one");
}

std::unique_ptr<Tokenizer> from_directory(const fs::path& dir) {
  std::error_code ec;
  const std::string name = fs::absolute(dir, ec).lexically_normal().filename().string().empty()
                               ? fs::absolute(dir, ec).lexically_normal().parent_path().filename().string()
                               : fs::absolute(dir, ec).lexically_normal().filename().string();
  const std::string cfg = read_if_exists(dir / "tokenizer_config.json");
  const auto marker = nlohmann::json::parse(cfg.empty() ? "{}" : cfg, nullptr, false);
  const bool ours_sp = marker.is_object() && marker.contains("runner_tokenizer") && marker["runner_tokenizer"] == "sentencepiece";
  // A SentencePiece tokenizer runner saved: its tokenizer.json is the copy for Hugging Face.
  if (ours_sp && fs::is_regular_file(dir / "tokenizer.model", ec)) return from_file(dir / "tokenizer.model", name);
  for (const char* f : {"tokenizer.json", "vocab.json", "encoder.json", "tokenizer.model"})
    if (fs::is_regular_file(dir / f, ec)) return from_file(dir / f, name);
  if (!cfg.empty()) {  // the byte tokenizer saves only its config
    const auto j = nlohmann::json::parse(cfg, nullptr, false);
    if (j.is_object() && j.value("runner_tokenizer", std::string()) == "byte") return byte_tokenizer();
  }
  throw UserError({dir.string(), 0, 0}, "no tokenizer files in this directory",
                  "it needs tokenizer.json, vocab.json + merges.txt, encoder.json + vocab.bpe or tokenizer.model (train one "
                  "with `runner data tokenizer train`)");
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == "byte") return byte_tokenizer();
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return from_directory(p);
  if (!fs::exists(p, ec))
    throw UserError({path, 0, 0}, "no such tokenizer file or directory", "give a tokenizer directory or file, or 'byte'");
  return from_file(p, p.filename().string());
}

}  // namespace runner::tok
