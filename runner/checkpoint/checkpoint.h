// Checkpoints: the training state as one HDF5 file per step, written atomically, read as
// untrusted input. The format is documented for h5dump/h5py users in docs/checkpoint-format.md.
//
// Design:
// - One logical tensor per dataset (/params/<name>, /optimizer/adam_m/<name>, ...), contiguous,
//   uncompressed, each with a crc32c attribute over its stored bytes. A contiguous dataset's
//   bytes sit at one file offset (H5Dget_offset), so verifying and loading read them with
//   pread, in bounded pieces, whatever the file claims; HDF5 is asked only for metadata, and
//   every shape, type and size is checked against what the state expects before any byte of
//   it is read.
// - Publication is a rename: write `.step_N.h5.tmp.<pid>`, verify it, fsync, rename, fsync the
//   directory, then replace LATEST the same way. A crash at any instant leaves the previous
//   checkpoint and LATEST as they were (docs/invariants.md, invariant 5).
// - CheckpointManager owns cadence, asynchronous writing (a snapshot in host memory at the
//   step boundary, one background writer, errors rethrown on the training thread), retention
//   and loading with fallback to the newest checkpoint that verifies.
// - The HDF5 library here is built without thread safety: every HDF5 call holds h5::Lock
//   (runner/hdf5/hdf5.h: one process-wide lock, shared with the data loader's workers),
//   taken per slab so a background write never starves the loader for long.
// - The code, by phase: file_layout (the layout, once), file_writer (creating it), write_serial,
//   write_collective, file_reader + load (reading, verifying), inspect, publish (the atomic
//   protocol), manager.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runner/recipe/recipe.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}
namespace parallel {
class Communicator;
}

namespace runner {

constexpr int kCheckpointFormatVersion = 2;  // bumped on any incompatible change of the layout (2: /names)
inline constexpr int kOldestCheckpointFormat = 1;  // still read: format 1 has no /names (its groups are iterated)

// ---- checksums ----
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), zlib-style chaining:
// crc32c(crc32c(0, a), b) == crc32c(0, a+b). Hardware instruction when the build targets
// SSE4.2 or ARMv8 CRC, else slicing-by-8 tables. crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);  // the table version, for tests

// ---- names in a checkpoint directory ----
std::string checkpoint_file_name(int64_t step);                          // "step_00000020.h5"
bool parse_checkpoint_file_name(const std::string& name, int64_t* step);  // false unless step_<digits>.h5
std::vector<int64_t> list_checkpoint_steps(const std::string& dir);      // ascending; [] if no dir
// The file name LATEST points to ("" when LATEST is missing or malformed).
std::string read_latest(const std::string& dir);
// Removes leftover temporaries (".*.tmp.*" regular files) of crashed writers. Returns how many.
int cleanup_stale(const std::string& dir);

// ---- one file ----
// Which rank of how many writes through this path (write_checkpoint_atomic: rank 0 writes
// LATEST). Multi-rank runs write through write_checkpoint_collective (below) or gather the
// logical state to rank 0 (state_shards.h).
struct CheckpointRank {
  int rank = 0;
  int size = 1;
};

struct WriteOptions {
  bool optimizer_bf16 = false;  // moments stored as bf16 (uint16 + dtype=bf16): halves them, NOT bit-exact
  CheckpointRank rank;
};

struct SaveResult {
  std::string path;        // the published file
  int64_t step = 0;
  int64_t tensor_bytes = 0;  // tensor data written
  int64_t file_bytes = 0;
  double write_seconds = 0;  // write + verify + fsync + rename + LATEST (the whole disk cost)
};

// Writes `state` into a new file at `path` (must not exist) and closes it. Throws
// std::runtime_error (I/O, disk full) naming the path; a fault injected by the hooks below
// throws CheckpointFault (or _exits). Returns the tensor bytes written.
int64_t write_checkpoint_file(const std::string& path, const TrainState& state, const WriteOptions& opt);

// The whole atomic protocol: temporary, verify, fsync, rename, fsync dir, LATEST (rank 0).
// Creates `dir` if needed. Leaves no temporary behind when it throws (a crash may, see cleanup_stale).
SaveResult write_checkpoint_atomic(const std::string& dir, const TrainState& state, const WriteOptions& opt);

// ---- collective writing (parallel HDF5): multi-rank checkpoints ----
// The same file, written by every rank of a job at once: each rank writes the part of each
// logical tensor it holds (state_shards.h maps shards to these slices), through one MPI-IO file,
// collectively. Nothing here knows about graphs or layouts.
//
// The rows of a logical tensor's dim 0 that this rank writes, and within each such row either
// everything or, along one logical dim >= 1, the HDF5 hyperslab (start, stride, count, block)
// with every other dim whole. The source holds those elements row by row: source row
// `src_row + k` is logical row `dst_row + k`, each `src_row_elems` elements in the selection's
// row-major order (a tensor-parallel shard in its own memory order is exactly that).
struct SliceRun {
  int64_t src_row = 0, dst_row = 0, rows = 0;
};
struct TensorSlice {
  const float* src = nullptr;   // fp32 source rows; nullptr: zeros (moments before the first update)
  int64_t src_row_elems = 0;
  std::vector<SliceRun> runs;   // ascending, disjoint dst rows; empty: this rank writes nothing
  int split_dim = -1;           // -1: whole rows
  int64_t start = 0, stride = 1, count = 1, block = 0;
};
struct CollectiveTensor {
  std::string name;             // parameter name: /params/<name>, /optimizer/adam_m/<name>, ...
  std::vector<int64_t> shape;   // logical shape (at least one dim)
};

// Collective over `comm` (every rank calls it with identical `tensors` and `opt`): writes the
// checkpoint of step s.step into `dir` and publishes it with the atomic protocol.
// - One temporary file, created collectively (parallel HDF5 over MPI-IO; `comm` must be an MPI
//   communicator unless it has one rank, which writes through the serial driver). Every group,
//   dataset and attribute is created by all ranks with identical arguments, in the serial
//   writer's order, so the file holds exactly what write_checkpoint_file writes.
// - /state and /recipe hold rank 0's scalars (broadcast); /rng/rank_<r> and /data/rank_<r> hold
//   rank r's own RNG state and data cursor (all-gathered; rank 0 writes the small datasets).
// - `slice(which, i)` (which: 0 parameter, 1 adam_m, 2 adam_v; i indexes `tensors`) is called on
//   every rank in that order and says what this rank writes of that dataset. It may run
//   collectives of its own (e.g. over a data-parallel group; the call order is the same on every
//   rank); its buffer must stay valid until the next call. The data is written with collective
//   H5Dwrite calls in bounded rounds (ranks without data in a round select nothing).
// - Checksums: after a flush and a barrier, the ranks read the tensor datasets' stored bytes back
//   (pread at H5Dget_offset, dataset k by rank k % size), all-reduce the crc32c values, and every
//   rank writes the identical attributes; then the file is closed collectively.
// - Rank 0 then verifies the temporary, fsyncs, renames, fsyncs the directory and writes LATEST.
// A failure on any rank (I/O, an injected fault) is agreed on before anything is published: the
// temporary is removed and every rank throws (std::runtime_error naming the first failing rank,
// or CheckpointFault). Returns the same SaveResult on every rank (write_seconds: this rank's).
SaveResult write_checkpoint_collective(parallel::Communicator& comm, const std::string& dir, const TrainState& s,
                                       const std::vector<CollectiveTensor>& tensors,
                                       const std::function<TensorSlice(int which, size_t i)>& slice,
                                       const WriteOptions& opt);

// Reads `path` into `state`, whose ParamSet names and shapes say what is expected. Checks every
// dataset's presence, type, shape and storage before reading any, then verifies each checksum.
// Throws UserError (loc = the file) naming the dataset at fault. On throw, `state`'s tensors
// may be partly overwritten (its scalars are not): load another checkpoint or discard it.
// Moments (adam_m/adam_v) are allocated (fp32, optimizer account) when `state` has none.
// Gradients are not part of a checkpoint (they are zero at a step boundary).
// subset: the file may hold parameters `state` does not ask for (a pipeline stage loads its
// own layers). The RNG and data entries of rank state.world_rank are used when the file has
// them, else rank 0's (another layout).
void load_checkpoint_file(const std::string& path, TrainState& state, bool subset = false);

// Verifies every dataset's checksum and /state's without a model. Throws UserError at the first problem.
void verify_checkpoint_file(const std::string& path);

// The resolved recipe stored in a checkpoint (checksum verified), for `runner resume`.
std::string read_recipe_text(const std::string& path);
// The step stored in a checkpoint's /state (checksum verified).
int64_t read_checkpoint_step(const std::string& path);

// `runner inspect`: step, tokens, versions, recipe summary, every dataset with shape, dtype,
// bytes and checksum status, and a verdict line. Throws UserError when the file cannot be opened
// as a checkpoint at all. *ok (if given) is set to whether everything verified.
std::string inspect_checkpoint(const std::string& path, bool* ok = nullptr);
// The same, run in a forked child process, so that a corrupt file that crashes the HDF5
// library (a signal inside its metadata code) is reported as a corrupt checkpoint (UserError
// naming the signal) instead of taking the caller down. For `runner inspect`.
std::string inspect_checkpoint_isolated(const std::string& path, bool* ok = nullptr);

// Keeps HDF5 from registering its exit-time cleanup (call first thing in main, before any other
// HDF5 call). Every handle the runner opens is closed by its owner; a file whose close failed
// (a disk that filled up mid-write) stays half-closed in the library, and the exit-time cleanup
// then crashes on it (SIGSEGV in H5F__close_cb) or loops ("infinite loop closing library").
void disable_hdf5_exit_cleanup();

// ---- fault injection (tests) ----
// A write that reaches `n` bytes of tensor data (n >= 0) stops: it throws CheckpointFault, or,
// when the environment has RUNNER_CKPT_FAULT_EXIT=1, calls _exit(137) to simulate a crash.
// n < 0 disables. Without a call, RUNNER_CKPT_FAULT_AFTER_BYTES from the environment is used.
void set_write_fault_after_bytes(int64_t n);
// Faults at a stage of the atomic protocol instead (same throw / _exit behaviour).
enum class WriteFault { None, BeforeClose, BeforeRename, BeforeLatest, BeforeLatestRename };
void set_write_fault_at(WriteFault where);
struct CheckpointFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- in-memory copies ----
// A deep copy of everything a checkpoint holds (params and moments cloned into `account`;
// gradients are not copied). What the async writer snapshots.
TrainState clone_state(const TrainState& s, ops::Account account);

// The cheap tier: a copy of the state in host memory every K steps, so a non-finite loss or a
// spike rolls back without touching disk. Buffers are reused when shapes do not change.
class MemorySnapshot {
 public:
  void take(const TrainState& s);
  // Copies params, moments, loader, rng, scaler, step, tokens, loss_ema back into `s` (whose
  // tensors must have the snapshot's shapes). Gradients and recipe_yaml are left alone.
  void restore(TrainState& s) const;
  bool valid() const { return valid_; }
  int64_t step() const { return state_.step; }
  size_t bytes() const;
  void clear();

 private:
  TrainState state_;
  bool valid_ = false;
};

// ---- the manager ----
class CheckpointManager {
 public:
  // Writes nothing until the first save (the directory is created then).
  CheckpointManager(std::string dir, CheckpointConfig cfg, CheckpointRank rank = {});
  ~CheckpointManager();  // joins a write in flight (its error is logged, not thrown)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  void set_logger(std::shared_ptr<spdlog::logger> log);  // default: spdlog's default logger
  const std::string& dir() const { return dir_; }

  // Whether a checkpoint is due after `step` (steps completed), `elapsed_seconds` into the run.
  // steps: step % every_steps == 0; minutes: every_minutes since the last due; auto: at the first
  // call, then every max(20 x measured write time, auto_min_interval_seconds) seconds; never: false.
  bool due(int64_t step, double elapsed_seconds);

  // Saves `s`. Sync: writes now. Async (config) and !final: snapshots `s` into host memory and
  // returns; a background thread writes; the next save waits for it. final: always synchronous
  // and durable on return. A save of a step already saved is skipped. Rethrows a stored
  // background error before anything else.
  void save(const TrainState& s, bool final = false);
  // Records a save that `write` performs and publishes itself (the collective writer of a
  // multi-rank run, save_sharded in state_shards.h): joins a write in flight (rethrowing its
  // error), skips a step already saved, runs `write` synchronously (when it throws, the step
  // does not count as saved and the error propagates), then applies retention when
  // `publisher` (world rank 0; other ranks' managers write nothing) and records the measurements
  // (stall = write time, last write, auto cadence) as save() does. Every rank of the job calls it.
  void save_external(int64_t step, const std::function<SaveResult()>& write, bool publisher);
  const WriteOptions& write_options() const { return wopt_; }
  void wait();  // joins a write in flight; rethrows its error
  void poll();  // rethrows a finished background write's error without waiting

  // Loads LATEST (or, without LATEST, the newest step file). A checkpoint that does not verify:
  // strict -> its UserError; otherwise logged (file and dataset) and the next older one is tried,
  // saying so; none verifies -> UserError listing each failure. Returns the step loaded, or
  // nullopt when the directory holds no checkpoint at all.
  std::optional<int64_t> load_latest(TrainState& s, bool strict);
  // Loads may fill only part of the parameters (see load_checkpoint_file's subset).
  void set_subset_load(bool subset) { subset_ = subset; }
  // Loads step_<step>.h5; if it does not verify and !strict, falls back to older ones.
  int64_t load_step(int64_t step, TrainState& s, bool strict);
  bool has_checkpoints() const;
  // Files to try when resuming, newest first: LATEST (or `step` >= 0, a UserError when there is
  // no such file), then older steps. Empty: none at all.
  std::vector<std::string> candidates(int64_t step) const;

  // Measurements.
  double last_stall_seconds() const;    // time save() blocked the caller (sync: whole write; async: snapshot)
  double last_write_seconds() const;    // disk cost of the last completed write
  double auto_interval_seconds() const; // 0 until measured (auto cadence)
  int64_t last_saved_step() const;
  int64_t saves_completed() const;
  double auto_min_interval_seconds = 10.0;  // floor of the auto interval (tiny models write in ms)

 private:
  void write_now(const TrainState& s);  // write + retention + measurements (either thread)
  void record_write(const SaveResult& r, bool publisher);  // retention (publisher) + log + measurements
  void apply_retention(int64_t newest);
  void join_and_rethrow();
  int64_t load_from(const std::vector<std::string>& candidates, TrainState& s, bool strict);
  spdlog::logger& log() const;

  std::string dir_;
  bool subset_ = false;
  CheckpointConfig cfg_;
  CheckpointRank rank_;
  WriteOptions wopt_;
  std::shared_ptr<spdlog::logger> log_;

  std::thread worker_;
  mutable std::mutex mu_;           // guards the fields below, shared with the writer thread
  std::exception_ptr error_;
  double last_stall_ = 0, last_write_ = 0, auto_interval_ = 0;
  int64_t last_saved_step_ = -1, saves_ = 0;
  double next_due_elapsed_ = -1;    // minutes/auto: when the next save is due (-1: not yet known)
  double last_due_elapsed_ = 0;     // auto: when the save whose cost is being measured was due
  bool auto_pending_ = false;       // auto: first save requested, its cost not yet known
};

}  // namespace runner
