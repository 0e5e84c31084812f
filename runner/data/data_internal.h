// Pieces of runner/data shared by its .cpp files and its tests; not part of the public API.
//
// - IndexPermutation: the O(1)-memory shuffle (a Feistel bijection with cycle-walking).
// - The addition task's held-out rule.
// - The concrete sources' factories (one per file kind) and the split arithmetic they share.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runner/data/data.h"

namespace runner::data_detail {

// A pseudo-random bijection of [0, n), keyed by `key`, evaluated in O(1) time and memory.
//
// A balanced Feistel network is a permutation of [0, 2^(2h)) whatever its round function
// (Luby-Rackoff); we take the smallest 2h >= bits(n-1) and "cycle-walk": re-apply the
// network until the value lands back in [0, n). Restricting a permutation to a subset by
// following its cycles is again a permutation of that subset, and since 2^(2h) < 4n the
// expected number of walks is below 4. This lets the loader shuffle 2^40 generated samples
// without materialising anything.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;  // requires i < n
  uint64_t size() const { return n_; }

 private:
  static constexpr int kRounds = 6;
  uint64_t feistel(uint64_t x) const;
  uint64_t n_;
  int half_bits_;
  uint64_t mask_;
  uint64_t round_key_[kRounds];
};

// The addition task holds out every problem (a, b) whose hash lands in 1/20 of the range.
// The rule depends only on (digits, a, b), never on a seed, so no seed can ever train on a
// problem that addition_eval_problems() or the Val split may return.
bool addition_held_out(int64_t digits, uint64_t a, uint64_t b);
constexpr uint64_t kAdditionHeldOutModulus = 20;
constexpr int64_t kAdditionMaxDigits = 18;  // a + b must fit in 64 bits

// An HDF5 split whose tokens take at most this many bytes (default 512 MiB) is read into
// memory at open, fully verified, and served without touching HDF5 again; a larger one is
// streamed window by window (serialized on h5::Lock, runner/hdf5/hdf5.h). Tests lower it to exercise both.
std::atomic<int64_t>& hdf5_in_memory_limit();

// Token range [begin, end) of one split of a token stream of n tokens. `whole` means the
// split has a file of its own (val_path) and so takes everything.
struct SplitRange {
  int64_t begin = 0, end = 0;
};
SplitRange split_range(int64_t n, const DataConfig& cfg, Split split, bool whole);

// Base of the file sources: sample i is the window of T+1 tokens starting at token
// begin + i*T of the split (stride T, so consecutive windows share one token: the last
// target of one is the first token of the next). num_samples = (end - begin - 1) / T.
class WindowSource : public DataSource {
 public:
  WindowSource(std::string path, SplitRange range, int64_t T) : path_(std::move(path)), range_(range), T_(T) {}
  int64_t num_samples() const override { return (range_.end - range_.begin - 1) / T_; }
  int64_t seq_len() const override { return T_; }
  void sample(int64_t index, int32_t* tokens, int32_t* targets) const override;
  // Tokens [start, start+count) of the whole file, for a source made of several files.
  void read_tokens(int64_t start, int64_t count, int32_t* out) const { read(start, count, out); }

 protected:
  // Tokens [start, start+count) of the whole file (not of the split).
  virtual void read(int64_t start, int64_t count, int32_t* out) const = 0;
  // "train split: tokens [a, b) of N, K samples of T+1 at stride T".
  std::string describe_windows(int64_t total_tokens) const;
  std::string path_;
  SplitRange range_;
  int64_t T_;
};

// Throws UserError unless the split holds at least T+1 tokens (one sample).
void check_split_length(const std::string& path, int64_t total_tokens, SplitRange range, Split split, bool whole,
                        int64_t T);

// The concrete sources. `path` is the file for this split (cfg.path, or cfg.val_path for
// Val when given); each checks format, length and token range and throws UserError.
std::unique_ptr<DataSource> open_addition(const DataConfig& cfg, Split split, int64_t T, int64_t vocab_size,
                                          uint64_t seed);
std::unique_ptr<DataSource> open_text(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                      int64_t T, int64_t vocab_size);
std::unique_ptr<WindowSource> open_bin(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                       int64_t T, int64_t vocab_size);
// `may_hold` false: stream even a split under hdf5_in_memory_limit() (a shard of a prepared
// dataset whose split as a whole is over it).
std::unique_ptr<WindowSource> open_hdf5(const std::string& path, const DataConfig& cfg, Split split, bool whole,
                                        int64_t T, int64_t vocab_size, bool may_hold = true);
// A prepared dataset directory (data.path) or a weighted mix of them (data.mix), runner/data/prepared.cpp.
std::unique_ptr<DataSource> open_prepared(const DataConfig& cfg, Split split, int64_t T, int64_t vocab_size);
// data.tokenizer, when given, must be the tokenizer the data was prepared with (`what` names the data).
void check_recipe_tokenizer(const DataConfig& cfg, const tok::TokenizerInfo& data, const std::string& what);

// One token shard being written by `runner data prepare`: append() in order, then finish()
// (which closes and syncs the file); destroying an unfinished writer leaves a partial file
// the caller removes with its temporary directory.
class ShardWriter {
 public:
  virtual ~ShardWriter() = default;
  virtual void append(const int32_t* tokens, int64_t n) = 0;
  virtual void finish(int64_t max_token) = 0;
};
// HDF5: a chunked, deflated 1-D 'tokens' dataset, uint16 (or int32 when `wide`), with the
// attributes vocab_size, tokenizer and max_token. bin: the llm.c layout (uint16 only).
std::unique_ptr<ShardWriter> h5_shard_writer(const std::string& path, bool wide, int64_t vocab_size,
                                             const std::string& tokenizer);
std::unique_ptr<ShardWriter> bin_shard_writer(const std::string& path);

// The weighted mix's schedule, a pure function of (weights, seed, global position): positions
// are cut in blocks of kMixBlock; each dataset's count in block b is the rounded cumulative
// target round((b+1)*B*w_k) - round(b*B*w_k) (the largest-weight dataset takes the rest), so
// its share after any whole number of blocks is exact to a sample; the block's slots are
// dealt by a seeded permutation. Returns (dataset k, how many samples of k come before).
constexpr int64_t kMixBlock = 4096;
class MixSchedule {
 public:
  explicit MixSchedule(std::vector<double> weights);
  std::pair<size_t, int64_t> at(int64_t position, uint64_t seed) const;

 private:
  int64_t before(size_t k, int64_t block) const;  // samples of dataset k in blocks [0, block)
  std::vector<double> w_;                         // normalised
  size_t rest_ = 0;                               // the dataset that takes each block's remainder
};

// Whether bytes meant as text are something else (text data pointed at an HDF5 or
// token file, `runner data prepare` given a binary file). Looks at the first kNotTextSample
// bytes: the HDF5 signature, the llm.c token-file magic, a NUL byte (no UTF-8 text holds one;
// uint16 token files are full of them), or mostly invalid UTF-8. `what` says which, with the
// offset; `kind` is the data.kind the file most likely is ("hdf5", "bin", or "" when unknown).
struct NotText {
  std::string what, kind;
};
constexpr int64_t kNotTextSample = 1 << 20;
std::optional<NotText> not_text(const unsigned char* bytes, int64_t n);

// The llm.c token file header: 256 int32, [0] magic, [1] version, [2] token count.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * 4;

}  // namespace runner::data_detail
