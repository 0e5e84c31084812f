// Reading prepared datasets: the manifest, the shards as one token stream per split, the
// weighted mix of several datasets, and the tokenizer checks and hand-over to the run.
//
// Design: a prepared dataset is read through the existing file sources, one per shard (so
// the HDF5 and .bin rules, verification and in-memory/streamed reading stay in one place),
// concatenated into one stream: windows of T+1 at stride T cross shard boundaries as they
// cross document boundaries. The mix orders itself (DataSource::orders_itself): its schedule
// is a pure function of (weights, seed, global position), so the loader's LoaderState (the
// global sample cursor and the seed) is all a resume needs, on any layout.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ops/rng.h"
#include "runner/data/data.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"

namespace runner {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

tok::TokenizerInfo byte_info() { return tok::byte_tokenizer()->info(); }

std::vector<DatasetShard> shards_of(const json& split, const std::string& manifest) {
  std::vector<DatasetShard> out;
  for (const json& s : split.at("shards")) {
    DatasetShard d{s.at("file").get<std::string>(), s.at("tokens").get<int64_t>()};
    if (d.file.empty() || d.file.find('/') != std::string::npos || d.tokens < 1)
      throw UserError(SourceLoc{manifest}, "shard entry '" + d.file + "' is not a file of the dataset directory",
                      "prepare the dataset again");
    out.push_back(d);
  }
  return out;
}

}  // namespace

bool is_prepared_dataset(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kDatasetManifest, ec);
}

DatasetManifest read_dataset_manifest(const std::string& dir, const SourceLoc& where) {
  const std::string manifest = (fs::path(dir) / kDatasetManifest).string();
  if (!is_prepared_dataset(dir))
    throw UserError(where.file.empty() ? SourceLoc{dir} : where, "not a prepared dataset (no " + manifest + ")",
                    "make one with `runner data prepare INPUT... " + dir + " --tokenizer T`");
  std::ifstream in(manifest, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  DatasetManifest m;
  m.dir = dir;
  try {
    const json j = json::parse(ss.str());
    if (j.value("runner_dataset", 0) != 1)
      throw UserError(SourceLoc{manifest}, "unknown manifest version", "prepare the dataset again with this runner");
    m.format = j.at("format").get<std::string>();
    m.dtype = j.at("dtype").get<std::string>();
    m.train = shards_of(j.at("train"), manifest);
    m.val = shards_of(j.at("val"), manifest);
    m.train_documents = j.at("train").at("documents").get<int64_t>();
    m.val_documents = j.at("val").at("documents").get<int64_t>();
    m.train_tokens = j.at("train").at("tokens").get<int64_t>();
    m.val_tokens = j.at("val").at("tokens").get<int64_t>();
    m.max_token = j.at("max_token").get<int64_t>();
    m.eos_id = j.at("eos_id").get<int64_t>();
    const json& t = j.at("tokenizer");
    m.tokenizer = {t.at("kind").get<std::string>(), t.at("name").get<std::string>(), t.at("vocab_size").get<int64_t>(),
                   t.at("hash").get<std::string>()};
  } catch (const json::exception& e) {
    throw UserError(SourceLoc{manifest}, std::string("malformed dataset manifest: ") + e.what(),
                    "prepare the dataset again (runner data prepare)");
  }
  if (m.format != "h5" && m.format != "bin")
    throw UserError(SourceLoc{manifest}, "unknown shard format '" + m.format + "'", "prepare the dataset again");
  return m;
}

namespace data_detail {

namespace {

// The shards of one split, read as one stream of tokens.
class ShardedSource final : public WindowSource {
 public:
  ShardedSource(const DatasetManifest& m, Split split, int64_t total, int64_t T, std::string mode)
      : WindowSource(m.dir, SplitRange{0, total}, T), split_(split), m_(m), mode_(std::move(mode)) {}

  void add(std::unique_ptr<WindowSource> shard, int64_t tokens) {
    shards_.push_back(std::move(shard));
    starts_.push_back(starts_.empty() ? 0 : starts_.back() + sizes_.back());
    sizes_.push_back(tokens);
    max_token_ = std::max(max_token_, shards_.back()->max_token());
  }
  std::string describe() const override {
    return "prepared " + m_.format + " " + path_ + " (" + m_.tokenizer.name + ", " + (split_ == Split::Train ? "train" : "val") +
           " split, " + std::to_string(shards_.size()) + " shard(s), " + mode_ + "): " + describe_windows(range_.end);
  }
  int64_t max_token() const override { return max_token_; }

 protected:
  void read(int64_t start, int64_t count, int32_t* out) const override {
    size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin()) - 1;
    while (count > 0) {
      const int64_t off = start - starts_[s], n = std::min(count, sizes_[s] - off);
      shards_[s]->read_tokens(off, n, out);
      start += n, out += n, count -= n;
      ++s;
    }
  }

 private:
  Split split_;
  DatasetManifest m_;
  std::string mode_;
  std::vector<std::unique_ptr<WindowSource>> shards_;
  std::vector<int64_t> starts_, sizes_;
  int64_t max_token_ = 0;
};

void check_vocab(const DatasetManifest& m, const SourceLoc& at, int64_t vocab_size) {
  if (m.tokenizer.vocab_size > vocab_size)
    throw UserError(at, "the dataset " + m.dir + " was tokenized with " + m.tokenizer.name + " (" + m.tokenizer.kind +
                            ", vocabulary " + std::to_string(m.tokenizer.vocab_size) + ") but model.vocab_size is " +
                            std::to_string(vocab_size),
                    "set model.vocab_size >= " + std::to_string(m.tokenizer.vocab_size) +
                        " (rounded up to a multiple of 64 runs faster)");
  if (m.max_token >= vocab_size)
    throw UserError(at, "the dataset " + m.dir + " holds token ids up to " + std::to_string(m.max_token) +
                            " but model.vocab_size is " + std::to_string(vocab_size),
                    "set model.vocab_size >= " + std::to_string(m.max_token + 1));
}

std::unique_ptr<ShardedSource> open_split(const DatasetManifest& m, const DataConfig& cfg, Split split, int64_t T,
                                          int64_t vocab_size, const SourceLoc& at) {
  if (to_string(cfg.kind) != (m.format == "h5" ? "hdf5" : "bin"))
    throw UserError(at, "data.kind is " + to_string(cfg.kind) + " but the dataset " + m.dir + " holds " + m.format + " shards",
                    std::string("set data.kind: ") + (m.format == "h5" ? "hdf5" : "bin"));
  check_vocab(m, at, vocab_size);
  const std::vector<DatasetShard>& shards = split == Split::Train ? m.train : m.val;
  int64_t total = 0;
  for (const DatasetShard& s : shards) total += s.tokens;
  if (split == Split::Val && shards.empty())
    throw UserError(at, "the dataset " + m.dir + " has no validation documents (prepared with --val-fraction 0, or too few documents)",
                    "prepare it again with --val-fraction > 0 (and several documents)");
  check_split_length(m.dir, total, SplitRange{0, total}, split, true, T);
  // The in-memory limit is the split's, not each shard's: many small shards held in memory
  // would hold the whole corpus.
  const bool may_hold = total * (m.dtype == "int32" ? 4 : 2) <= hdf5_in_memory_limit().load();
  auto src = std::make_unique<ShardedSource>(m, split, total, T,
                                             m.format == "bin" ? "memory-mapped" : may_hold ? "held in memory" : "streamed");
  DataConfig one = cfg;
  one.dataset = "tokens";
  for (const DatasetShard& s : shards) {
    const std::string path = (fs::path(m.dir) / s.file).string();
    // T = 0: a shard is only read as tokens, never cut into windows (a last shard may hold one token).
    std::unique_ptr<WindowSource> shard = m.format == "h5" ? open_hdf5(path, one, Split::Train, true, 0, vocab_size, may_hold)
                                                           : open_bin(path, one, Split::Train, true, 0, vocab_size);
    src->add(std::move(shard), s.tokens);
  }
  return src;
}

constexpr uint64_t kMixSalt = 0x4d49'5853'4348'4544ull;   // the block permutations
constexpr uint64_t kMixEpochSalt = 0x4d49'5845'504f'4348ull;  // each dataset's own epochs

// Datasets drawn in proportion to their weights (MixSchedule); within each dataset, its own
// samples in a fresh permutation per pass over it.
class MixSource final : public DataSource {
 public:
  MixSource(std::vector<std::unique_ptr<ShardedSource>> parts, std::vector<double> weights)
      : parts_(std::move(parts)), schedule_(weights), weights_(std::move(weights)) {}
  std::string describe() const override {
    std::string s = "mix of " + std::to_string(parts_.size()) + ":";
    for (size_t k = 0; k < parts_.size(); ++k)
      s += (k ? "; " : " ") + std::to_string(weights_[k]) + " x " + parts_[k]->describe();
    return s;
  }
  int64_t num_samples() const override {
    int64_t n = 0;
    for (const auto& p : parts_) n += p->num_samples();
    return n;
  }
  int64_t max_token() const override {
    int64_t m = 0;
    for (const auto& p : parts_) m = std::max(m, p->max_token());
    return m;
  }
  int64_t seq_len() const override { return parts_[0]->seq_len(); }
  bool orders_itself() const override { return true; }
  void sample(int64_t index, int32_t* tokens, int32_t* targets) const override { sample_at(index, 0, tokens, targets); }
  void sample_at(int64_t position, uint64_t seed, int32_t* tokens, int32_t* targets) const override {
    const auto [k, q] = schedule_.at(position, seed);
    const int64_t n = parts_[k]->num_samples(), epoch = q / n;
    const IndexPermutation perm(static_cast<uint64_t>(n), ops::rng_key(seed, kMixEpochSalt, k, static_cast<uint64_t>(epoch)));
    parts_[k]->sample(static_cast<int64_t>(perm(static_cast<uint64_t>(q % n))), tokens, targets);
  }

 private:
  std::vector<std::unique_ptr<ShardedSource>> parts_;
  MixSchedule schedule_;
  std::vector<double> weights_;
};

std::unique_ptr<DataSource> open_mix(const DataConfig& cfg, Split split, int64_t T, int64_t vocab_size) {
  std::vector<DatasetManifest> ms;
  for (const DataMixEntry& e : cfg.mix) {
    std::error_code ec;
    if (!fs::exists(e.path, ec))
      throw UserError(e.loc, "data.mix dataset " + e.path + " not found", "check the path (relative paths are read beside the recipe)");
    ms.push_back(read_dataset_manifest(e.path, e.loc));
    if (ms.back().tokenizer.hash != ms[0].tokenizer.hash)
      throw UserError(e.loc, "data.mix datasets use different tokenizers: " + ms[0].dir + " has " + ms[0].tokenizer.name +
                                 " (hash " + ms[0].tokenizer.hash.substr(0, 12) + "), " + e.path + " has " +
                                 ms.back().tokenizer.name + " (hash " + ms.back().tokenizer.hash.substr(0, 12) + ")",
                      "prepare every mixed dataset with the same --tokenizer");
  }
  check_recipe_tokenizer(cfg, ms[0].tokenizer, "data.mix");
  std::vector<std::unique_ptr<ShardedSource>> parts;
  std::vector<double> weights;
  for (size_t k = 0; k < ms.size(); ++k) {
    parts.push_back(open_split(ms[k], cfg, split, T, vocab_size, cfg.mix[k].loc));
    weights.push_back(cfg.mix[k].weight);
  }
  return std::make_unique<MixSource>(std::move(parts), std::move(weights));
}

}  // namespace

// data.tokenizer, when given, must be the tokenizer the data was prepared with.
void check_recipe_tokenizer(const DataConfig& cfg, const tok::TokenizerInfo& data, const std::string& what) {
  if (cfg.tokenizer.empty()) return;
  const tok::TokenizerInfo want = tok::load_tokenizer(cfg.tokenizer)->info();
  if (want.hash != data.hash)
    throw UserError(SourceLoc{cfg.tokenizer}, "data.tokenizer is " + want.name + " (" + want.kind + ", vocabulary " +
                                                  std::to_string(want.vocab_size) + ", hash " + want.hash.substr(0, 12) +
                                                  ") but " + what + " was prepared with " + data.name + " (" + data.kind +
                                                  ", vocabulary " + std::to_string(data.vocab_size) + ", hash " +
                                                  data.hash.substr(0, 12) + ")",
                    "point data.tokenizer at the tokenizer the data was prepared with, or prepare the data again with it");
}

MixSchedule::MixSchedule(std::vector<double> weights) : w_(std::move(weights)) {
  RUNNER_CHECK(!w_.empty() && static_cast<int64_t>(w_.size()) * static_cast<int64_t>(w_.size()) <= kMixBlock,
               "a mix of " + std::to_string(w_.size()) + " datasets");
  double sum = 0;
  for (double w : w_) {
    RUNNER_CHECK(w > 0, "mix weights must be positive");
    sum += w;
  }
  for (double& w : w_) w /= sum;
  rest_ = static_cast<size_t>(std::max_element(w_.begin(), w_.end()) - w_.begin());
}

// The largest weight is >= 1/K, so its remainder per block, B*w - (K-1) rounding steps, stays
// positive while K*K <= B (the constructor's check).
int64_t MixSchedule::before(size_t k, int64_t block) const {
  const double slots = static_cast<double>(block) * static_cast<double>(kMixBlock);
  if (k != rest_) return std::llround(slots * w_[k]);
  int64_t others = 0;
  for (size_t j = 0; j < w_.size(); ++j)
    if (j != rest_) others += std::llround(slots * w_[j]);
  return block * kMixBlock - others;
}

std::pair<size_t, int64_t> MixSchedule::at(int64_t position, uint64_t seed) const {
  const int64_t b = position / kMixBlock, s = position % kMixBlock;
  const IndexPermutation perm(kMixBlock, ops::rng_key(seed, kMixSalt, static_cast<uint64_t>(b)));
  const int64_t v = static_cast<int64_t>(perm(static_cast<uint64_t>(s)));
  int64_t start = 0;
  for (size_t k = 0; k < w_.size(); ++k) {
    const int64_t first = before(k, b), n = before(k, b + 1) - first;
    if (v < start + n) return {k, first + (v - start)};
    start += n;
  }
  RUNNER_CHECK(false, "mix schedule slot " + std::to_string(v) + " unassigned");
  return {0, 0};
}

std::unique_ptr<DataSource> open_prepared(const DataConfig& cfg, Split split, int64_t T, int64_t vocab_size) {
  if (!cfg.mix.empty()) return open_mix(cfg, split, T, vocab_size);
  const DatasetManifest m = read_dataset_manifest(cfg.path);
  check_recipe_tokenizer(cfg, m.tokenizer, "the dataset " + cfg.path);
  return open_split(m, cfg, split, T, vocab_size, SourceLoc{cfg.path});
}

}  // namespace data_detail

std::optional<DataTokenizer> data_tokenizer(const DataConfig& cfg) {
  if (cfg.kind == DataKind::addition || cfg.kind == DataKind::text) return DataTokenizer{byte_info(), "", 0};
  const std::string dir = cfg.mix.empty() ? cfg.path : cfg.mix[0].path;
  if (!is_prepared_dataset(dir)) return std::nullopt;
  const DatasetManifest m = read_dataset_manifest(dir);
  return DataTokenizer{m.tokenizer, (fs::path(dir) / "tokenizer").string(), m.eos_id};
}

std::optional<int64_t> prepared_vocabulary(const DataConfig& cfg) {
  std::vector<std::string> dirs;
  if (cfg.mix.empty()) dirs.push_back(cfg.path);
  for (const auto& m : cfg.mix) dirs.push_back(m.path);
  std::optional<int64_t> v;
  for (const std::string& dir : dirs)
    if (!dir.empty() && is_prepared_dataset(dir)) v = std::max(v.value_or(0), read_dataset_manifest(dir).tokenizer.vocab_size);
  return v;
}

namespace {

json tokenizer_json(const tok::TokenizerInfo& t) {
  return {{"kind", t.kind}, {"name", t.name}, {"vocab_size", t.vocab_size}, {"hash", t.hash}};
}

// Copies a directory's files (not recursively: a tokenizer is a few flat files).
void copy_files(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  for (const auto& e : fs::directory_iterator(from, ec))
    if (e.is_regular_file()) fs::copy_file(e.path(), to / e.path().filename(), fs::copy_options::overwrite_existing, ec);
  if (ec) throw UserError(SourceLoc{to.string()}, "cannot copy the tokenizer files from " + from.string() + ": " + ec.message(),
                          "check free disk space and permissions");
}

}  // namespace

void install_run_tokenizer(const DataConfig& cfg, const std::string& run_dir, const std::optional<std::string>& source) {
  std::optional<DataTokenizer> dt = data_tokenizer(cfg);
  if (source && !dt && !source->empty()) {  // token files of unknown origin: the weights' tokenizer names them
    const auto t = tok::load_tokenizer(*source);
    dt = DataTokenizer{t->info(), *source, t->eos_id().value_or(-1)};
  }
  const fs::path record = fs::path(run_dir) / "data.json";
  std::error_code ec;
  if (fs::is_regular_file(record, ec)) {  // a resumed run: the same tokenizer, or the ids mean other text
    std::ifstream in(record);
    const json old = json::parse(in, nullptr, false);
    const std::string was = old.is_object() && old.contains("tokenizer") && old["tokenizer"].is_object()
                                ? old["tokenizer"].value("hash", "") : "";
    if (dt && !was.empty() && was != dt->info.hash)
      throw UserError(SourceLoc{record.string()}, "this run was trained on data tokenized with " +
                                                      old["tokenizer"].value("name", "?") + " (hash " + was.substr(0, 12) +
                                                      "), the data is now tokenized with " + dt->info.name + " (hash " +
                                                      dt->info.hash.substr(0, 12) + ")",
                      "train the new data in a new run (another train.run_dir), or point data at the run's dataset");
  }
  json j{{"tokenizer", dt ? tokenizer_json(dt->info) : json()}, {"eos_id", dt ? json(dt->eos_id) : json()}};
  json sets = json::array();
  if (cfg.mix.empty()) sets.push_back(cfg.path);
  for (const DataMixEntry& e : cfg.mix) sets.push_back({{"path", e.path}, {"weight", e.weight}});
  j["datasets"] = sets;
  const fs::path dest = fs::path(run_dir) / "tokenizer";
  if (dt && dt->info.kind != "byte" && !dt->files.empty()) {
    const fs::path tmp = fs::path(run_dir) / "tokenizer.tmp";
    fs::remove_all(tmp, ec);
    copy_files(dt->files, tmp);
    fs::remove_all(dest, ec);
    fs::rename(tmp, dest, ec);
    if (ec) throw UserError(SourceLoc{dest.string()}, "cannot put the tokenizer in place: " + ec.message(), "check permissions");
  } else {
    fs::remove_all(dest, ec);  // byte-level (or unknown): no directory, as generate and export expect
  }
  std::ofstream(record) << j.dump(2) << "\n";
}

}  // namespace runner
