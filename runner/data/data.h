// Training data: sources, the deterministic sharded loader, and the built-in task.
//
// Order is defined on GLOBAL batches and only then split by data-parallel rank, so every
// layout sees the same samples in the same step (layout equivalence, resume on another
// layout). The loader's whole position is one small struct (LoaderState) that a
// checkpoint stores. Background workers prepare micro-batches `prefetch` ahead; the time
// the training loop waits for data is measured.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"

namespace runner {

// A micro-batch: B sequences of T tokens. targets[i] is the token that follows tokens[i];
// a negative target means "no loss here" (padding, or the prompt part of a task).
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens;   // (B,T)
  std::vector<int32_t> targets;  // (B,T)
};

enum class Split { Train, Val };

// A sequence-addressable source of fixed-length training samples.
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual std::string describe() const = 0;    // one line for the startup table
  virtual int64_t num_samples() const = 0;     // samples in one epoch (may be huge for generated tasks)
  virtual int64_t max_token() const = 0;       // largest token id that can appear (checked against vocab)
  virtual int64_t seq_len() const = 0;         // T: tokens per sample (the loader sizes batches by it)
  // Writes sample `index` (0 <= index < num_samples) as T tokens and T targets.
  virtual void sample(int64_t index, int32_t* tokens, int32_t* targets) const = 0;
};

// Opens and checks the configured source (file exists, format, token range against
// vocab_size) BEFORE anything is written anywhere; throws UserError naming the file and
// what was expected.
std::unique_ptr<DataSource> open_source(const DataConfig& cfg, Split split, int64_t seq_len, int64_t vocab_size,
                                        uint64_t seed);

// sample_cursor counts global samples consumed by all dp ranks together, ranks assumed in
// lockstep: after each rank has taken j of the accum micro-batches of step g it is
// g*global + j*micro*dp. At a step boundary it is step*global in every layout (so such a
// checkpoint resumes under any layout); mid-step it still names each rank's next
// micro-batch exactly, for the same layout. restore() adopts `seed` too (the order the run
// was trained on wins over the recipe's).
struct LoaderState {
  int64_t sample_cursor = 0;  // global samples consumed (all dp ranks together)
  uint64_t seed = 0;
  bool operator==(const LoaderState&) const = default;
};

// Global batch g = samples [g*global, (g+1)*global) of the shuffled order; dp rank r takes
// the contiguous slice [r*global/dp, (r+1)*global/dp) of it, cut into micro-batches of
// `micro` sequences. The order within an epoch is a permutation of the epoch's samples,
// drawn from (seed, epoch).
struct LoaderConfig {
  int64_t global_batch = 1;  // sequences per optimizer step, all ranks
  int64_t micro = 1;         // sequences per micro-batch on this rank
  int dp_rank = 0, dp_size = 1;
  bool shuffle = true;
  int64_t workers = 1;
  int64_t prefetch = 4;
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const DataSource> source, LoaderConfig cfg, uint64_t seed);
  ~DataLoader();
  // This rank's next micro-batch (blocks on the prefetch queue; the wait is measured).
  Batch next();
  // Milliseconds next() spent waiting since the last call to take_wait_ms().
  double take_wait_ms();
  // State at a step boundary (every micro-batch of the step consumed); callable anywhere,
  // see LoaderState. Counts micro-batches returned by next(), not those prefetched.
  LoaderState state() const;
  // Drops prefetched batches and restarts at s. A cursor that is not a micro-batch
  // boundary of this layout (a mid-step checkpoint from another layout) is a UserError.
  void restore(const LoaderState& s);
  int64_t epoch() const;  // sample_cursor / num_samples

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The built-in task: multi-digit addition, a skill with a measurable score.
// A sample is packed problems "ddd+ddd=" followed by the sum's digits (reversed, most
// significant last, fixed width) and '\n', byte-tokenized; loss only on answer tokens.
struct AdditionProblem {
  std::vector<int32_t> prompt;  // tokens up to and including '='
  std::vector<int32_t> answer;  // the expected completion tokens (digits then '\n')
};
// Held-out problems (disjoint from training by construction), deterministic in seed.
std::vector<AdditionProblem> addition_eval_problems(int64_t digits, int64_t count, uint64_t seed);

// Byte-level tokenizer (vocab 256).
std::vector<int32_t> byte_tokenize(const std::string& text);
std::string byte_detokenize(const std::vector<int32_t>& tokens);

// `runner data prepare`: text file -> HDF5 token dataset (uint16 if vocab fits, else int32).
// Returns the number of tokens written. Checks a stop flag periodically (may be null). A file
// that is not text (an HDF5 or token file, NUL bytes, mostly invalid UTF-8) is refused
// unless `binary_ok` (--binary-ok).
int64_t prepare_text_to_hdf5(const std::string& text_path, const std::string& out_path,
                             const std::atomic<bool>* stop = nullptr, bool binary_ok = false);

}  // namespace runner
