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
#include <cstdio>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"
#include "runner/tokenize/tokenizer.h"

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
  // A source that orders itself (a weighted mix: its schedule is a pure function of the seed
  // and the global position) is asked for global position p with the loader's seed instead
  // of the loader's shuffled p % num_samples: the loader's per-epoch permutation would turn
  // exact per-block shares into random ones.
  virtual bool orders_itself() const { return false; }
  virtual void sample_at(int64_t position, uint64_t seed, int32_t* tokens, int32_t* targets) const {
    (void)seed;
    sample(position % num_samples(), tokens, targets);
  }
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

// Fault injection (tests): each micro-batch a loader made after this call builds takes `ms`
// longer, as a slow file system or tokenizer would make it (a slow data source, for the
// monitoring's tests); 0 disables. The fault hook (runner/train/fault_hook.h) sets it from
// RUNNER_DEBUG_DATA_DELAY_MS.
void set_batch_build_delay_ms(int64_t ms);

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

// ---------------------------------------------------------------------------------------
// Prepared datasets (`runner data prepare INPUT... OUT --tokenizer T`, runner/data/prepare.cpp):
// a directory of token shards with a train/validation split by documents, the tokenizer's
// files in OUT/tokenizer/ and a manifest, OUT/dataset.json (see read_dataset_manifest).

struct PrepareOptions {
  std::vector<std::string> inputs;  // text files, directories (walked), JSONL files (.jsonl, .ndjson)
  std::string out;                  // the dataset directory to write
  std::string tokenizer = "byte";   // what tok::load_tokenizer accepts
  double val_fraction = 0.05;       // share of the documents held out for validation
  std::string format = "h5";        // h5 | bin
  std::string field = "text";       // the JSONL field holding a document's text
  int64_t shard_tokens = int64_t{1} << 27;  // tokens per shard file (128 Mi: 256 MiB of uint16)
  int threads = 0;                  // tokenizing threads; 0: every core
  bool force = false;               // replace a non-empty OUT
  bool binary_ok = false;           // tokenize the bytes of a named input that is not text
  // A special token's text in the corpus (a literal <|endoftext|>) is encoded as ordinary text,
  // as tiktoken does, instead of becoming the special id (Hugging Face's default, which adds a
  // document boundary the corpus never had). The occurrences are counted and reported either way.
  bool special_as_text = false;
  const std::atomic<bool>* stop = nullptr;  // checked between chunks: stops with nothing written
  std::FILE* progress = stderr;     // progress bar and notes (null: silent)
  double progress_every_s = 5.0;    // a line this often when `progress` is not a terminal
};

struct PrepareResult {
  int64_t documents = 0, val_documents = 0;  // documents in each split
  int64_t tokens = 0, val_tokens = 0;        // tokens in each split, end-of-document ids included
  int64_t bytes = 0;                         // input bytes read
  double seconds = 0;
  int64_t special_text = 0;                  // occurrences of a special token's text in the inputs
};

// Tokenizes every document (a text file, or a JSONL record) on `threads` threads and writes the
// dataset; the output is byte-identical whatever the thread count. Every user mistake (missing
// input, OUT not empty without force, a tokenizer without an end-of-document id, no documents)
// is a UserError before anything is written; OUT appears only complete (a temporary directory
// renamed into place).
PrepareResult prepare_dataset(const PrepareOptions& opt);
// The same with a tokenizer already loaded (opt.tokenizer is then only the name in messages).
PrepareResult prepare_dataset(const PrepareOptions& opt, const tok::Tokenizer& tokenizer);

// What OUT/dataset.json records.
struct DatasetShard {
  std::string file;  // relative to the dataset directory
  int64_t tokens = 0;
};
struct DatasetManifest {
  std::string dir;                         // the dataset directory (as given)
  std::string format;                      // h5 | bin
  std::string dtype;                       // uint16 | int32
  std::vector<DatasetShard> train, val;
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t max_token = 0;
  int64_t eos_id = 0;
  tok::TokenizerInfo tokenizer;
};
constexpr const char* kDatasetManifest = "dataset.json";
// Whether `path` is a directory holding a dataset manifest.
bool is_prepared_dataset(const std::string& path);
// Reads and checks OUT/dataset.json (UserError at `where`, or at the manifest, naming what is wrong).
DatasetManifest read_dataset_manifest(const std::string& dir, const SourceLoc& where = {});

// The tokenizer the configured data was tokenized with: a prepared dataset's (data.path or
// data.mix), the byte tokenizer for text and the addition task, nullopt for a plain token
// file (its tokenizer is unknown). `files` is the directory holding its files (empty: byte).
struct DataTokenizer {
  tok::TokenizerInfo info;
  std::string files;
  int64_t eos_id = -1;
};
std::optional<DataTokenizer> data_tokenizer(const DataConfig& cfg);
// The largest tokenizer vocabulary among the prepared datasets the data names (data.path or
// every data.mix entry); nullopt when none is a prepared dataset. For validation
// (runner::set_data_vocabulary).
std::optional<int64_t> prepared_vocabulary(const DataConfig& cfg);

// At `runner train` start (rank 0, after the checks): copies the data's tokenizer files to
// RUN_DIR/tokenizer/ (not for the byte tokenizer: no such directory means byte) and records
// it in RUN_DIR/data.json ({"tokenizer": {kind, name, vocab_size, hash}, "eos_id", "datasets"}).
// A run resumed on data with another tokenizer than the one it recorded is a UserError, raised
// before anything is written.
// `source` overrides where the files come from (the run's choice between the data's tokenizer
// and model.init_from's: runner/train/init_from.h choose_run_tokenizer; "" = none, bytes).
void install_run_tokenizer(const DataConfig& cfg, const std::string& run_dir,
                           const std::optional<std::string>& source = std::nullopt);

// `runner data prepare`: text file -> HDF5 token dataset (uint16 if vocab fits, else int32).
// Returns the number of tokens written. Checks a stop flag periodically (may be null). A file
// that is not text (an HDF5 or token file, NUL bytes, mostly invalid UTF-8) is refused
// unless `binary_ok` (--binary-ok).
int64_t prepare_text_to_hdf5(const std::string& text_path, const std::string& out_path,
                             const std::atomic<bool>* stop = nullptr, bool binary_ok = false);

}  // namespace runner
