// SentencePiece .model files through libsentencepiece (the reference implementation itself),
// and its trainer. The hash is the model file's bytes (the serialized proto is the model).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "runner/errors.h"
#include "runner/tokenize/sentencepiece.h"
#include "runner/tokenize/stages.h"

namespace runner::tok {

namespace fs = std::filesystem;

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, std::string bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {
    const auto st = sp_.LoadFromSerializedProto(bytes_);
    if (!st.ok()) throw UserError({path, 0, 0}, "not a SentencePiece model: " + st.ToString(), "give a .model file written by SentencePiece's trainer");
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    sp_.Encode(text, &ids);  // const: one processor serves every thread
    return {ids.begin(), ids.end()};
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v;
    v.reserve(ids.size());
    for (int32_t id : ids)
      if (id >= 0 && id < sp_.GetPieceSize()) v.push_back(id);
    std::string out;
    sp_.Decode(v, &out);
    return out;
  }
  TokenizerInfo info() const override { return {"sentencepiece", name_, sp_.GetPieceSize(), fnv1a_hex(bytes_)}; }
  std::optional<int32_t> eos_id() const override { return id_or_none(sp_.eos_id()); }
  std::optional<int32_t> bos_id() const override { return id_or_none(sp_.bos_id()); }
  void save(const std::string& dir) const override {
    fs::create_directories(dir);
    std::ofstream(fs::path(dir) / "tokenizer.model", std::ios::binary) << bytes_;
    std::ofstream cfg(fs::path(dir) / "tokenizer_config.json");
    cfg << "{\n  \"tokenizer_class\": \"LlamaTokenizer\"";
    if (eos_id()) cfg << ",\n  \"eos_token\": \"" << sp_.IdToPiece(*eos_id()) << "\"";
    if (bos_id()) cfg << ",\n  \"bos_token\": \"" << sp_.IdToPiece(*bos_id()) << "\"";
    if (sp_.unk_id() >= 0) cfg << ",\n  \"unk_token\": \"" << sp_.IdToPiece(sp_.unk_id()) << "\"";
    cfg << "\n}\n";
    if (!cfg) throw UserError({(fs::path(dir) / "tokenizer_config.json").string(), 0, 0}, "cannot write", "check the directory");
  }

 private:
  static std::optional<int32_t> id_or_none(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }
  sentencepiece::SentencePieceProcessor sp_;
  std::string bytes_, name_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, std::string bytes, std::string name) {
  return std::make_unique<SentencePieceTokenizer>(path, std::move(bytes), std::move(name));
}

namespace {

uintmax_t check_inputs(const TrainOptions& opt) {
  if (opt.inputs.empty()) throw UserError({}, "no corpus given", "name one or more text files");
  uintmax_t bytes = 0;
  for (const std::string& f : opt.inputs) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) throw UserError({f, 0, 0}, "no such text file", "name text files (one sentence or paragraph per line)");
    bytes += fs::file_size(f, ec);
  }
  if (opt.model_type != "bpe" && opt.model_type != "unigram")
    throw UserError({}, "--model " + opt.model_type + " is not a SentencePiece model type", "use --model bpe or --model unigram");
  if (!(opt.character_coverage >= 0.98 && opt.character_coverage <= 1))  // SentencePiece's own bounds
    throw UserError({}, "--character-coverage " + std::to_string(opt.character_coverage) + " is not in [0.98, 1]", "use e.g. 0.9995 (the default) or 1");
  if (opt.vocab_size < 300) throw UserError({}, "--vocab " + std::to_string(opt.vocab_size) + " is too small", "use at least 300 (256 byte tokens + 3 specials + some pieces)");
  return bytes;
}

}  // namespace

void train_sentencepiece(const TrainOptions& opt) {
  const uintmax_t bytes = check_inputs(opt);
  fs::create_directories(opt.out_dir);
  std::string inputs;
  for (const std::string& f : opt.inputs) inputs += (inputs.empty() ? "" : ",") + f;
  const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::unordered_map<std::string, std::string> args = {
      {"input", inputs}, {"model_prefix", (fs::path(opt.out_dir) / "tokenizer").string()},
      {"vocab_size", std::to_string(opt.vocab_size)}, {"model_type", opt.model_type},
      {"byte_fallback", "true"}, {"split_digits", "true"}, {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"}, {"remove_extra_whitespaces", "false"}, {"add_dummy_prefix", "true"},
      {"max_sentence_length", "16384"}, {"input_sentence_size", "5000000"}, {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)}, {"character_coverage", std::to_string(opt.character_coverage)}, {"minloglevel", "0"}, {"hard_vocab_limit", "false"},
  };
  std::printf("training a SentencePiece %s tokenizer, vocabulary %d, on %zu file(s), %.1f MB, %d threads\n",
              opt.model_type.c_str(), opt.vocab_size, opt.inputs.size(), static_cast<double>(bytes) / 1e6, threads);
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  const auto st = sentencepiece::SentencePieceTrainer::Train(args);
  if (!st.ok()) {
    const std::string msg = st.ToString();
    const bool chars = msg.find("required_chars") != std::string::npos;
    throw UserError({opt.inputs[0], 0, 0}, "SentencePiece could not train: " + msg,
                    chars ? "the corpus has more distinct characters than --vocab leaves room for: raise --vocab or lower "
                            "--character-coverage (down to 0.98; rarer characters are then spelt in bytes)"
                          : "a smaller --vocab usually helps (the corpus must hold enough distinct pieces)");
  }
  std::error_code ec;
  fs::remove(fs::path(opt.out_dir) / "tokenizer.vocab", ec);  // the .model holds the vocabulary
  const std::string model_path = (fs::path(opt.out_dir) / "tokenizer.model").string();
  std::ifstream in(model_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const fs::path shown = opt.final_dir.empty() ? fs::path(opt.out_dir) : fs::path(opt.final_dir);
  auto tok = load_sentencepiece(model_path, ss.str(), shown.filename().string());
  tok->save(opt.out_dir);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trained in %.1f s: %s (vocabulary %lld, hash %s)\n", s, (shown / "tokenizer.model").c_str(),
              static_cast<long long>(tok->info().vocab_size), tok->info().hash.c_str());
}

}  // namespace runner::tok
