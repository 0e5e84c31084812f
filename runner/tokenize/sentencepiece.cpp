// SentencePiece .model files through libsentencepiece (the reference implementation itself),
// and its trainer. The hash is the model file's bytes (the serialized proto is the model); the
// trainer stores none of the paths or the thread count it ran with, so the same corpus and
// settings give the same bytes in any output folder.
//
// Speed: libsentencepiece's BPE encodes a long text several times slower per byte than the
// same text given a line at a time. A BPE model that merges exactly as runner's own BPE can
// (same_as_merges) is encoded by it; another BPE model is encoded in segments of a few
// kilobytes, cut before a space that stands between two non-space characters, every segment
// after the first through a second processor whose model has no dummy prefix. That gives
// exactly the whole text's ids when no piece holds a space after another character (so no
// piece spans the cut) and the normalizer acts on each character alone (identity rules,
// whitespace kept): segmentable() checks both. Unigram and other models are encoded whole.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "runner/errors.h"
#include "runner/tokenize/sentencepiece.h"
#include "runner/tokenize/sentencepiece_proto.h"
#include "runner/tokenize/stages.h"

namespace runner::tok {

namespace fs = std::filesystem;

// The BPE merges transformers' SentencePieceExtractor derives from a model's pieces: every
// split of a piece into two pieces, best piece (by score) first, then by the parts' ids.
std::vector<std::pair<std::string, std::string>> sp_bpe_merges(const SpModelView& m);

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, std::string bytes, std::string name)
      : bytes_(std::move(bytes)), name_(std::move(name)) {
    const auto view = read_sp_model(bytes_);
    const auto st = sp_.LoadFromSerializedProto(bytes_);
    if (!st.ok() || !view)
      throw UserError({path, 0, 0},
                      "this file is damaged: its " + std::to_string(bytes_.size()) + " bytes are not a complete SentencePiece model" +
                          (view ? " (" + st.ToString() + ")" : ""),
                      "copy the tokenizer.model again from where it came from, or train it again");
    if (sp_.GetPieceSize() > kMaxSpPieces)
      throw UserError({path, 0, 0}, "the model has " + std::to_string(sp_.GetPieceSize()) + " pieces, more than runner's bound of " +
                                        std::to_string(kMaxSpPieces), "use a tokenizer with a smaller vocabulary");
    if (segmentable(*view)) {
      const auto st2 = rest_.LoadFromSerializedProto(sp_with_dummy_prefix(bytes_, false));
      segmented_ = st2.ok();
      if (segmented_ && same_as_merges(*view)) bpe_ = merges_pipeline(*view);
    }
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    if (!bpe_) return encode_from(text, sp_);
    if (!dummy_prefix_ || text.empty()) return bpe_->encode(text);
    std::string spaced;  // the dummy prefix: a space, escaped as ▁ like the others
    spaced.reserve(text.size() + 1);
    spaced.push_back(' ');
    spaced.append(text);
    return bpe_->encode(spaced);
  }
  // Control tokens' text (</s>) is never matched in the input by SentencePiece: it is always
  // text, so there is nothing to count or choose.
  int64_t encode_part(std::string_view text, const EncodeOptions& o, std::vector<int32_t>& out) const override {
    const std::vector<int32_t> ids = !o.continues || !segmented_ ? encode(text) : bpe_ ? bpe_->encode(text) : encode_from(text, rest_);
    out.insert(out.end(), ids.begin(), ids.end());
    return 0;
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
    // The marker makes load_tokenizer() take tokenizer.model (the hash's source) before the
    // tokenizer.json written beside it for Hugging Face.
    cfg << "{\n  \"tokenizer_class\": \"LlamaTokenizerFast\",\n  \"runner_tokenizer\": \"sentencepiece\"";
    if (eos_id()) cfg << ",\n  \"eos_token\": \"" << sp_.IdToPiece(*eos_id()) << "\"";
    if (bos_id()) cfg << ",\n  \"bos_token\": \"" << sp_.IdToPiece(*bos_id()) << "\"";
    if (sp_.unk_id() >= 0) cfg << ",\n  \"unk_token\": \"" << sp_.IdToPiece(sp_.unk_id()) << "\"";
    cfg << "\n}\n";
    if (!cfg) throw UserError({(fs::path(dir) / "tokenizer_config.json").string(), 0, 0}, "cannot write", "check the directory");
    if (const auto view = read_sp_model(bytes_)) {
      if (auto json = hf_tokenizer_json(*view)) {
        std::ofstream hf(fs::path(dir) / "tokenizer.json", std::ios::binary);
        hf << *json;
        hf.close();
        if (!hf) throw UserError({(fs::path(dir) / "tokenizer.json").string(), 0, 0}, "cannot write (disk full?)", "check the directory");
      }
    }
  }

 private:
  static std::optional<int32_t> id_or_none(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }

  // Whether a text may be cut before a space between two non-space characters (see above).
  static bool segmentable(const SpModelView& m) {
    // BPE only: a Unigram model's Viterbi sums scores in float32 along the whole text, so a
    // segment's choice between paths of nearly equal score can depend on the text before it.
    if (m.model_type != 2 || !m.escape_whitespaces || m.treat_whitespace_as_suffix || m.remove_extra_whitespaces ||
        !m.charsmap_empty)
      return false;
    for (const SpPiece& p : m.pieces) {
      size_t lead = 0;
      while (p.piece.compare(lead, kMetaspace.size(), kMetaspace) == 0) lead += kMetaspace.size();
      if (lead < p.piece.size() && p.piece.find(kMetaspace, lead) != std::string::npos) return false;
      if (p.piece.find(' ') != std::string::npos) return false;
    }
    return true;
  }

  static bool space_between_words(std::string_view t, size_t i) {
    auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; };
    return t[i] == ' ' && i > 0 && i + 1 < t.size() && !ws(t[i - 1]) && !ws(t[i + 1]);
  }

  // `first` encodes the first segment; every later one goes through rest_.
  std::vector<int32_t> encode_from(std::string_view text, const sentencepiece::SentencePieceProcessor& first) const {
    std::vector<int32_t> out;
    std::vector<int> ids;
    const sentencepiece::SentencePieceProcessor* sp = &first;
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.size();
      if (segmented_ && text.size() - at > 2 * kSegmentBytes) {
        end = at + kSegmentBytes;
        while (end < text.size() && !space_between_words(text, end)) ++end;
      }
      sp->Encode(text.substr(at, end - at), &ids);  // const: one processor serves every thread
      out.insert(out.end(), ids.begin(), ids.end());
      sp = &rest_;
      at = end;
    }
    if (text.empty()) {
      first.Encode(text, &ids);
      out.assign(ids.begin(), ids.end());
    }
    return out;
  }

  // Whether runner's own BPE, given the pieces' merges ranked by the merged piece
  // (rank_by_result), merges exactly as SentencePiece's BPE: both take the pair whose merged
  // piece scores best, the leftmost among pairs giving that piece. That holds when every
  // normal piece has its own score (no tie between two pieces), when no piece is unused or
  // user-defined (SentencePiece treats those apart) and when unknown characters fall back to
  // bytes. The ids equal libsentencepiece's on the multi-megabyte sample of
  // tests/test_tokenizer_sp.cpp; it runs several times faster.
  static bool same_as_merges(const SpModelView& m) {
    if (m.model_type != 2 || !m.byte_fallback) return false;
    std::unordered_map<float, int> scores;
    for (const SpPiece& p : m.pieces) {
      if (p.type == 4 || p.type == 5) return false;
      if (p.type == 1 && scores[p.score]++ > 0) return false;
    }
    return true;
  }

  // Spaces escaped as ▁, then BPE over the pieces; the dummy prefix is added by encode().
  std::unique_ptr<Tokenizer> merges_pipeline(const SpModelView& m) {
    dummy_prefix_ = m.add_dummy_prefix;
    Pipeline p;
    p.kind = "bpe";
    p.normalizers.push_back({NormalizerStep::replace, " ", std::string(kMetaspace)});
    std::vector<std::string> tokens;
    BpeOptions o;
    for (size_t i = 0; i < m.pieces.size(); ++i) {
      tokens.push_back(m.pieces[i].type == 1 || m.pieces[i].type == 6 ? m.pieces[i].piece : std::string());
      if (m.pieces[i].type == 2 && o.unk_id < 0) o.unk_id = static_cast<int32_t>(i);
    }
    std::unordered_set<std::string> normal;
    for (const SpPiece& x : m.pieces)
      if (x.type == 1) normal.insert(x.piece);
    std::vector<std::pair<std::string, std::string>> merges;
    for (auto& mg : sp_bpe_merges(m))  // among normal pieces only: control and byte pieces are not text
      if (normal.count(mg.first) && normal.count(mg.second) && normal.count(mg.first + mg.second)) merges.push_back(std::move(mg));
    o.byte_fallback = true;
    o.fuse_unk = true;
    o.rank_by_result = true;
    try {
      p.bpe = std::make_unique<BpeModel>(std::move(tokens), merges, o);
    } catch (const std::invalid_argument&) {
      return nullptr;  // a merge outside the normal pieces: keep libsentencepiece
    }
    return make_pipeline_tokenizer(std::move(p), name_, SourceFiles{});
  }

  static constexpr size_t kSegmentBytes = 2048;
  sentencepiece::SentencePieceProcessor sp_, rest_;
  bool segmented_ = false, dummy_prefix_ = true;
  std::unique_ptr<Tokenizer> bpe_;  // runner's BPE when it merges as libsentencepiece does
  std::string bytes_, name_;
};

}  // namespace

// transformers' conversion of a SentencePiece model (LlamaConverter, SentencePieceExtractor),
// written from the model's pieces: the same vocabulary, BPE merges made from every pair of
// pieces whose concatenation is a piece (ranked by that piece's score, best first, then by
// the parts' ids), the dummy prefix and the escaping of spaces as normalizers, byte fallback.
// Only models whose normalizer acts on each character alone convert exactly; others get none.
std::vector<std::pair<std::string, std::string>> sp_bpe_merges(const SpModelView& m) {
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < m.pieces.size(); ++i) ids.emplace(m.pieces[i].piece, static_cast<int32_t>(i));
  struct M { int32_t l, r; float score; };
  std::vector<M> merges;
  for (const SpPiece& p : m.pieces) {
    std::vector<M> local;
    for (size_t k = 1; k < p.piece.size(); ++k) {
      if ((static_cast<unsigned char>(p.piece[k]) & 0xC0) == 0x80) continue;  // a split between characters
      const auto l = ids.find(p.piece.substr(0, k)), r = ids.find(p.piece.substr(k));
      if (l != ids.end() && r != ids.end()) local.push_back({l->second, r->second, p.score});
    }
    std::sort(local.begin(), local.end(), [](const M& a, const M& b) { return a.l != b.l ? a.l < b.l : a.r < b.r; });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const M& a, const M& b) { return a.score > b.score; });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const M& x : merges) out.emplace_back(m.pieces[x.l].piece, m.pieces[x.r].piece);
  return out;
}

std::optional<std::string> hf_tokenizer_json(const SpModelView& m) {
  if (!(m.model_type == 1 || m.model_type == 2) || !m.escape_whitespaces || m.treat_whitespace_as_suffix ||
      m.remove_extra_whitespaces || !m.charsmap_empty || m.pieces.empty())
    return std::nullopt;
  using oj = nlohmann::ordered_json;
  const std::string ms(kMetaspace);
  int32_t unk = -1;
  oj added = oj::array();
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const SpPiece& p = m.pieces[i];
    if (p.type == 2 && unk < 0) unk = static_cast<int32_t>(i);
    if (p.type == 2 || p.type == 3 || p.type == 4)
      added.push_back({{"id", i}, {"content", p.piece}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", p.type != 4}});
  }
  oj model;
  if (m.model_type == 2) {
    oj vocab = oj::object();
    for (size_t i = 0; i < m.pieces.size(); ++i) vocab[m.pieces[i].piece] = i;
    const auto merges = sp_bpe_merges(m);
    oj ml = oj::array();
    for (const auto& [l, r] : merges) ml.push_back(oj::array({l, r}));
    model = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk >= 0 ? oj(m.pieces[unk].piece) : oj()},
             {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", true},
             {"byte_fallback", m.byte_fallback}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", ml}};
  } else {
    oj vocab = oj::array();
    for (const SpPiece& p : m.pieces) vocab.push_back(oj::array({p.piece, static_cast<double>(p.score)}));
    model = {{"type", "Unigram"}, {"unk_id", unk >= 0 ? oj(unk) : oj()}, {"vocab", vocab}, {"byte_fallback", m.byte_fallback}};
  }
  oj norms = oj::array();
  if (m.add_dummy_prefix) norms.push_back({{"type", "Prepend"}, {"prepend", ms}});
  norms.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", ms}});
  oj decoders = oj::array({{{"type", "Replace"}, {"pattern", {{"String", ms}}}, {"content", " "}},
                           {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  if (m.add_dummy_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  oj j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", norms}}}, {"pre_tokenizer", nullptr},
          {"post_processor", nullptr}, {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}}, {"model", model}};
  return j.dump(1) + "\n";
}

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

namespace {

bool is_jsonl(const fs::path& p) { return p.extension() == ".jsonl" || p.extension() == ".ndjson"; }

// What the trainer is given: the text files as they are, and the records' texts of the JSONL
// files gathered in one temporary file in the output folder (removed when done).
struct TrainCorpus {
  std::vector<std::string> files;
  fs::path extracted;
  int64_t long_lines = 0, bad_records = 0;
  std::string first_long, first_bad;  // file:line of the first
  ~TrainCorpus() {
    std::error_code ec;
    if (!extracted.empty()) fs::remove(extracted, ec);
  }
};

void count_long_lines(const std::string& file, TrainCorpus& c) {
  std::ifstream in(file, std::ios::binary);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.size() > kMaxTrainLine && c.long_lines++ == 0) c.first_long = file + ":" + std::to_string(n);
  }
}

void gather_corpus(const TrainOptions& opt, TrainCorpus& c) {
  std::ofstream out;
  for (const std::string& f : opt.inputs) {
    if (!is_jsonl(f)) {
      c.files.push_back(f);
      count_long_lines(f, c);
      continue;
    }
    if (c.extracted.empty()) {
      c.extracted = fs::path(opt.out_dir) / (".jsonl-text-" + std::to_string(::getpid()) + ".txt");
      out.open(c.extracted, std::ios::binary);
      if (!out) throw UserError({c.extracted.string(), 0, 0}, "cannot write the JSONL records' text here", "check the --out folder's permissions");
      c.files.push_back(c.extracted.string());
    }
    std::ifstream in(f, std::ios::binary);
    int64_t n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      const auto it = j.is_object() ? j.find(opt.field) : j.end();
      if (!j.is_object() || it == j.end() || !it->is_string()) {
        if (line.find_first_not_of(" \t\r") != std::string::npos && c.bad_records++ == 0) c.first_bad = f + ":" + std::to_string(n);
        continue;
      }
      const std::string text = it->get<std::string>();
      size_t start = 0;  // the record's lines: each a sentence for the trainer
      while (start <= text.size()) {
        const size_t end = std::min(text.find('\n', start), text.size());
        if (end - start > kMaxTrainLine && c.long_lines++ == 0) c.first_long = f + ":" + std::to_string(n);
        start = end + 1;
      }
      out << text << '\n';
    }
  }
  if (out.is_open()) {
    out.close();
    if (!out) throw UserError({c.extracted.string(), 0, 0}, "cannot write the JSONL records' text (disk full?)", "check free space");
  }
}

}  // namespace

void train_sentencepiece(const TrainOptions& opt) {
  const uintmax_t bytes = check_inputs(opt);
  fs::create_directories(opt.out_dir);
  TrainCorpus corpus;
  gather_corpus(opt, corpus);
  std::string inputs;
  for (const std::string& f : corpus.files) inputs += (inputs.empty() ? "" : ",") + f;
  const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::unordered_map<std::string, std::string> args = {
      {"input", inputs}, {"model_prefix", (fs::path(opt.out_dir) / "tokenizer").string()},
      {"vocab_size", std::to_string(opt.vocab_size)}, {"model_type", opt.model_type},
      {"byte_fallback", "true"}, {"split_digits", "true"}, {"allow_whitespace_only_pieces", "true"},
      {"normalization_rule_name", "identity"}, {"remove_extra_whitespaces", "false"}, {"add_dummy_prefix", "true"},
      {"max_sentence_length", std::to_string(kMaxTrainLine)}, {"input_sentence_size", "5000000"}, {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(threads)}, {"character_coverage", std::to_string(opt.character_coverage)}, {"minloglevel", "2"}, {"hard_vocab_limit", "false"},
  };
  if (corpus.bad_records > 0)
    std::printf("skipped %lld JSONL record(s) without a string field '%s' (the first at %s)\n",
                static_cast<long long>(corpus.bad_records), opt.field.c_str(), corpus.first_bad.c_str());
  if (corpus.long_lines > 0)
    std::printf("SentencePiece leaves out %lld line(s) longer than %zu bytes from training (the first at %s); they are "
                "still encoded, in pieces the rest of the corpus taught it\n",
                static_cast<long long>(corpus.long_lines), kMaxTrainLine, corpus.first_long.c_str());
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
  auto tok = load_sentencepiece(model_path, sp_without_training_paths(ss.str()), shown.filename().string());
  tok->save(opt.out_dir);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("trained in %.1f s: %s (vocabulary %lld, hash %s)\n", s, (shown / "tokenizer.model").c_str(),
              static_cast<long long>(tok->info().vocab_size), tok->info().hash.c_str());
}

}  // namespace runner::tok
