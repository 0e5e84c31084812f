// Data: opening sources, the byte tokenizer, the O(1) shuffle and the prefetching loader.
//
// The loader's order is defined once, on the GLOBAL sample stream: position p (counted
// from the start of training, across epochs) is sample perm_{seed, p / N}(p % N) of the
// source, N = num_samples. Global batch g is positions [g*G, (g+1)*G); dp rank r takes
// [g*G + r*G/dp, g*G + (r+1)*G/dp) and cuts it into accum = G/(dp*micro) micro-batches. Every
// quantity is a pure function of (seed, position), so the worker threads can build
// micro-batches in any order and any number; sequence numbers put them back in order.
//
// The cursor (LoaderState::sample_cursor) counts GLOBAL samples consumed by all dp ranks
// together, assuming the ranks move in lockstep: after this rank has consumed j of the
// accum micro-batches of step g, the cursor is g*G + j*micro*dp. So at a step boundary it
// is step*G whatever the layout (a checkpoint written there resumes under any layout),
// and mid-step it still names exactly the next micro-batch each rank would take.
#include "runner/data/data.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include "ops/rng.h"
#include "runner/data/data_internal.h"
#include "runner/errors.h"

namespace runner {

namespace data_detail {

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
  RUNNER_CHECK(n >= 1, "IndexPermutation over an empty range");
  int bits = std::max(2, static_cast<int>(std::bit_width(n - 1)));
  half_bits_ = (bits + 1) / 2;
  mask_ = half_bits_ >= 64 ? ~0ull : (1ull << half_bits_) - 1;
  for (int r = 0; r < kRounds; ++r) round_key_[r] = ops::mix64(key ^ ops::mix64(0x5eed0000ull + r));
}

uint64_t IndexPermutation::feistel(uint64_t x) const {
  uint64_t L = x >> half_bits_, R = x & mask_;
  for (int r = 0; r < kRounds; ++r) {
    uint64_t next = L ^ (ops::mix64(round_key_[r] ^ R) & mask_);
    L = R;
    R = next;
  }
  return (L << half_bits_) | R;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  RUNNER_CHECK(i < n_, "permutation index out of range");
  uint64_t x = i;
  do x = feistel(x); while (x >= n_);
  return x;
}

SplitRange split_range(int64_t n, const DataConfig& cfg, Split split, bool whole) {
  if (whole) return {0, n};
  int64_t n_val = static_cast<int64_t>(static_cast<double>(n) * cfg.val_fraction);
  n_val = std::clamp<int64_t>(n_val, 0, n);
  if (split == Split::Train) return {0, n - n_val};
  return {n - n_val, n};
}

void WindowSource::sample(int64_t index, int32_t* tokens, int32_t* targets) const {
  RUNNER_CHECK(index >= 0 && index < num_samples(), "sample index " + std::to_string(index) + " out of range");
  thread_local std::vector<int32_t> buf;
  buf.resize(static_cast<size_t>(T_ + 1));
  read(range_.begin + index * T_, T_ + 1, buf.data());
  std::copy(buf.begin(), buf.end() - 1, tokens);
  std::copy(buf.begin() + 1, buf.end(), targets);
}

std::string WindowSource::describe_windows(int64_t total_tokens) const {
  return "tokens [" + std::to_string(range_.begin) + ", " + std::to_string(range_.end) + ") of " +
         std::to_string(total_tokens) + ": " + std::to_string(num_samples()) + " samples of T+1=" +
         std::to_string(T_ + 1) + " at stride " + std::to_string(T_);
}

void check_split_length(const std::string& path, int64_t total_tokens, SplitRange range, Split split, bool whole,
                        int64_t T) {
  const int64_t n = range.end - range.begin;
  if (n >= T + 1) return;
  const std::string need = "one sample needs seq_len+1 = " + std::to_string(T + 1) + " tokens";
  if (whole || (range.begin == 0 && range.end == total_tokens))
    throw UserError(SourceLoc{path}, "holds " + std::to_string(total_tokens) + " tokens; " + need,
                    "use a longer file or a shorter model.seq_len");
  if (split == Split::Train)
    throw UserError(SourceLoc{path}, "the train split (after holding out the last data.val_fraction for validation) holds " +
                                         std::to_string(n) + " of " + std::to_string(total_tokens) + " tokens; " + need,
                    "lower data.val_fraction, give data.val_path, use a longer file or a shorter model.seq_len");
  if (n == 0)
    throw UserError(SourceLoc{path}, "no validation data: data.val_fraction leaves 0 of " +
                                         std::to_string(total_tokens) + " tokens for validation",
                    "set data.val_fraction > 0 or give data.val_path");
  throw UserError(SourceLoc{path}, "the validation split (the last data.val_fraction of the file) holds " +
                                       std::to_string(n) + " of " + std::to_string(total_tokens) + " tokens; " + need,
                  "raise data.val_fraction, give data.val_path, or shorten model.seq_len");
}

}  // namespace data_detail

using namespace data_detail;

// ---------------------------------------------------------------------------------------
// open_source: the checks every kind shares, then the kind's own opener.

namespace {
void check_model_shape(int64_t seq_len, int64_t vocab_size) {
  if (seq_len < 1)
    throw UserError(SourceLoc{}, "model.seq_len = " + std::to_string(seq_len) + " is not positive",
                    "set model.seq_len >= 1");
  if (vocab_size < 1)
    throw UserError(SourceLoc{}, "model.vocab_size = " + std::to_string(vocab_size) + " is not positive",
                    "set model.vocab_size (256 for the byte tokenizer)");
}
}  // namespace

std::unique_ptr<DataSource> open_source(const DataConfig& cfg, Split split, int64_t seq_len, int64_t vocab_size,
                                        uint64_t seed) {
  namespace fs = std::filesystem;
  const bool is_file_kind = cfg.kind == DataKind::text || cfg.kind == DataKind::hdf5 || cfg.kind == DataKind::bin;
  if (cfg.kind != DataKind::addition && !is_file_kind)  // only a DataKind cast from garbage
    throw UserError(SourceLoc{}, "unknown data.kind " + std::to_string(static_cast<int>(cfg.kind)),
                    "use one of addition | text | hdf5 | bin");

  // A directory `runner data prepare` wrote (or several, mixed): its own split, its own checks.
  const bool prepared = is_file_kind && (!cfg.mix.empty() || is_prepared_dataset(cfg.path));
  if (prepared) check_model_shape(seq_len, vocab_size);
  if (prepared) return open_prepared(cfg, split, seq_len, vocab_size);

  // Missing files first, both of them whichever split is asked for: a run that would only
  // discover at its first evaluation that val_path is wrong has already cost work.
  if (is_file_kind) {
    const std::string expected = cfg.kind == DataKind::text  ? "a UTF-8 text file"
                                 : cfg.kind == DataKind::bin ? "a uint16 token file (nanoGPT or llm.c .bin)"
                                                     : "an HDF5 file with a 1-D token dataset '" + cfg.dataset + "'";
    if (cfg.path.empty())
      throw UserError(SourceLoc{}, "data.kind '" + to_string(cfg.kind) + "' needs data.path",
                      "set data.path to the " + to_string(cfg.kind) + " file to train on");
    for (const std::string* p : {&cfg.path, &cfg.val_path}) {
      if (p->empty()) continue;
      std::error_code ec;
      auto st = fs::status(*p, ec);
      const std::string field = p == &cfg.path ? "data.path" : "data.val_path";
      if (!fs::exists(st))
        throw UserError(SourceLoc{*p}, "data file not found (data.kind " + to_string(cfg.kind) + " expects " + expected + ")",
                        "check " + field + " (relative paths are taken from the working directory)");
      if (!fs::is_regular_file(st))
        throw UserError(SourceLoc{*p}, "not a regular file (data.kind " + to_string(cfg.kind) + " expects " + expected + ")",
                        "point " + field + " at a file");
    }
  }

  check_model_shape(seq_len, vocab_size);
  if (is_file_kind && !(cfg.val_fraction >= 0.0 && cfg.val_fraction < 1.0))
    throw UserError(SourceLoc{cfg.path}, "data.val_fraction = " + std::to_string(cfg.val_fraction) +
                                             " is outside [0, 1)",
                    "use a small fraction such as 0.05");

  if (cfg.kind == DataKind::addition) return open_addition(cfg, split, seq_len, vocab_size, seed);

  // With a val_path, each split is a whole file: path trains, val_path validates.
  const bool whole = !cfg.val_path.empty();
  const std::string& path = split == Split::Val && whole ? cfg.val_path : cfg.path;
  if (cfg.kind == DataKind::text) {
    check_recipe_tokenizer(cfg, tok::byte_tokenizer()->info(), "text data (read as bytes)");
    return open_text(path, cfg, split, whole, seq_len, vocab_size);
  }
  if (cfg.kind == DataKind::bin) return open_bin(path, cfg, split, whole, seq_len, vocab_size);
  return open_hdf5(path, cfg, split, whole, seq_len, vocab_size);
}

// ---------------------------------------------------------------------------------------
// Byte tokenizer.

std::vector<int32_t> byte_tokenize(const std::string& text) {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

// Tokens outside [0, 256) (a model with a larger vocabulary may sample them) print as '?'.
std::string byte_detokenize(const std::vector<int32_t>& tokens) {
  std::string out(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= 0 && tokens[i] < 256) out[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  return out;
}

// ---------------------------------------------------------------------------------------
// DataLoader.
//
// Workers claim rank-local micro-batch sequence numbers in increasing order, at most
// `prefetch` ahead of the consumer, build them without holding the lock and drop them in
// ring slot seq % prefetch. next() waits for the slot of exactly the sequence number it
// needs, so the order never depends on thread timing. An exception in a worker (a corrupt
// token met while reading) travels in the slot and is rethrown by next().

namespace {
constexpr uint64_t kShuffleSalt = 0x5348'5546'464c'4521ull;
std::atomic<int64_t> g_build_delay_ms{0};  // set_batch_build_delay_ms
}  // namespace

void set_batch_build_delay_ms(int64_t ms) { g_build_delay_ms.store(ms > 0 ? ms : 0); }

struct DataLoader::Impl {
  struct Slot {
    int64_t seq = -1;
    bool ready = false;
    Batch batch;
    std::exception_ptr error;
  };

  std::shared_ptr<const DataSource> src;
  LoaderConfig cfg;
  uint64_t seed = 0;
  int64_t T = 0, N = 0;       // sequence length, samples per epoch
  int64_t local = 0;          // sequences per step on this rank (G / dp)
  int64_t accum = 0;          // micro-batches per step on this rank

  mutable std::mutex mu;
  std::condition_variable cv_work, cv_ready;
  int64_t consumed = 0;       // rank-local index of the next micro-batch next() returns
  int64_t next_claim = 0;     // next sequence number a worker will build
  bool stopping = false;
  bool started = false;
  std::vector<Slot> ring;
  std::vector<std::thread> threads;
  double wait_ms = 0.0;
  // The injected slow data source (set_batch_build_delay_ms): each micro-batch takes this many
  // ms longer to build.
  int64_t delay_ms = g_build_delay_ms.load();

  // First global position of rank-local micro-batch m.
  int64_t first_position(int64_t m) const {
    int64_t step = m / accum, j = m % accum;
    return step * cfg.global_batch + cfg.dp_rank * local + j * cfg.micro;
  }

  Batch build(int64_t m) const {
    Batch b;
    b.B = cfg.micro;
    b.T = T;
    b.tokens.resize(static_cast<size_t>(b.B * T));
    b.targets.resize(static_cast<size_t>(b.B * T));
    const int64_t p0 = first_position(m);
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    int64_t cached_epoch = -1;
    std::unique_ptr<IndexPermutation> perm;
    for (int64_t i = 0; i < b.B; ++i) {
      if (src->orders_itself()) {  // a mix: its own schedule over global positions
        src->sample_at(p0 + i, seed, b.tokens.data() + i * T, b.targets.data() + i * T);
        continue;
      }
      const int64_t p = p0 + i, epoch = p / N, pos = p % N;
      int64_t index = pos;
      if (cfg.shuffle) {
        if (epoch != cached_epoch) {
          perm = std::make_unique<IndexPermutation>(static_cast<uint64_t>(N), ops::rng_key(seed, kShuffleSalt, epoch));
          cached_epoch = epoch;
        }
        index = static_cast<int64_t>((*perm)(static_cast<uint64_t>(pos)));
      }
      src->sample(index, b.tokens.data() + i * T, b.targets.data() + i * T);
    }
    return b;
  }

  void worker_loop() {
    const int64_t depth = static_cast<int64_t>(ring.size());
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv_work.wait(lock, [&] { return stopping || next_claim < consumed + depth; });
      if (stopping) return;
      const int64_t seq = next_claim++;
      lock.unlock();
      Batch batch;
      std::exception_ptr error;
      try {
        batch = build(seq);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      Slot& slot = ring[static_cast<size_t>(seq % depth)];
      slot.seq = seq;
      slot.ready = true;
      slot.batch = std::move(batch);
      slot.error = error;
      cv_ready.notify_all();
    }
  }

  void start() {
    if (started || cfg.workers <= 0) return;
    stopping = false;
    next_claim = consumed;
    for (auto& s : ring) s = Slot{};
    for (int64_t w = 0; w < cfg.workers; ++w) threads.emplace_back([this] { worker_loop(); });
    started = true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv_work.notify_all();
    for (auto& t : threads) t.join();
    threads.clear();
    started = false;
    for (auto& s : ring) s = Slot{};
  }
};

DataLoader::DataLoader(std::shared_ptr<const DataSource> source, LoaderConfig cfg, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  RUNNER_CHECK(source != nullptr, "DataLoader needs a source");
  RUNNER_CHECK(cfg.dp_size >= 1 && cfg.dp_rank >= 0 && cfg.dp_rank < cfg.dp_size,
               "dp rank " + std::to_string(cfg.dp_rank) + " outside dp size " + std::to_string(cfg.dp_size));
  RUNNER_CHECK(cfg.micro >= 1 && cfg.global_batch >= 1, "batch sizes must be positive");
  RUNNER_CHECK(cfg.global_batch % (cfg.micro * cfg.dp_size) == 0,
               "global batch " + std::to_string(cfg.global_batch) + " is not a multiple of micro " +
                   std::to_string(cfg.micro) + " x dp " + std::to_string(cfg.dp_size) +
                   " (the plan should have rejected this)");
  I.src = std::move(source);
  I.cfg = cfg;
  I.seed = seed;
  I.T = I.src->seq_len();
  I.N = I.src->num_samples();
  RUNNER_CHECK(I.T >= 1 && I.N >= 1, "source has no samples: " + I.src->describe());
  I.local = cfg.global_batch / cfg.dp_size;
  I.accum = I.local / cfg.micro;
  I.ring.resize(static_cast<size_t>(std::max<int64_t>(1, cfg.prefetch)));
}

DataLoader::~DataLoader() { impl_->stop(); }

Batch DataLoader::next() {
  Impl& I = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  Batch out;
  if (I.cfg.workers <= 0) {
    // No workers: build in the caller (the "wait" is then the build time).
    out = I.build(I.consumed);
    std::lock_guard<std::mutex> lock(I.mu);
    ++I.consumed;
  } else {
    std::unique_lock<std::mutex> lock(I.mu);
    I.start();
    const int64_t depth = static_cast<int64_t>(I.ring.size());
    Impl::Slot& slot = I.ring[static_cast<size_t>(I.consumed % depth)];
    I.cv_ready.wait(lock, [&] { return slot.ready && slot.seq == I.consumed; });
    if (slot.error) std::rethrow_exception(slot.error);  // stays in the slot: the loader is stuck here
    out = std::move(slot.batch);
    slot = Impl::Slot{};
    ++I.consumed;
    lock.unlock();
    I.cv_work.notify_all();
  }
  I.wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

double DataLoader::take_wait_ms() {
  double w = impl_->wait_ms;
  impl_->wait_ms = 0.0;
  return w;
}

LoaderState DataLoader::state() const {
  const Impl& I = *impl_;
  std::lock_guard<std::mutex> lock(I.mu);
  const int64_t step = I.consumed / I.accum, j = I.consumed % I.accum;
  return LoaderState{step * I.cfg.global_batch + j * I.cfg.micro * I.cfg.dp_size, I.seed};
}

void DataLoader::restore(const LoaderState& s) {
  Impl& I = *impl_;
  const int64_t per_micro = I.cfg.micro * I.cfg.dp_size;
  if (s.sample_cursor < 0 || (s.sample_cursor % I.cfg.global_batch) % per_micro != 0)
    throw UserError(SourceLoc{}, "data cursor " + std::to_string(s.sample_cursor) +
                                     " does not fall on a micro-batch boundary of this layout (global batch " +
                                     std::to_string(I.cfg.global_batch) + ", micro " + std::to_string(I.cfg.micro) +
                                     " x dp " + std::to_string(I.cfg.dp_size) + ")",
                    "resume from a checkpoint taken at a step boundary, or with the layout that wrote it");
  I.stop();
  // The checkpoint's seed wins: resuming must replay the order the run was trained on.
  I.seed = s.seed;
  I.consumed = (s.sample_cursor / I.cfg.global_batch) * I.accum + (s.sample_cursor % I.cfg.global_batch) / per_micro;
  I.next_claim = I.consumed;
  // Workers restart lazily on the next call to next().
}

// The epoch the global cursor is in (a rank may already be reading the next one).
int64_t DataLoader::epoch() const { return state().sample_cursor / impl_->N; }

}  // namespace runner
