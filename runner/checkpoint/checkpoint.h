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
// - Around the files, two orchestrators: the resume chooser (resume.h: which checkpoint a run
//   continues from, verified in a child process, isolated.h; loading it) and the saver
//   (saver.h: cadence, the serial, asynchronous or collective path, retention).
// - The HDF5 library here is built without thread safety: every HDF5 call holds h5::Lock
//   (runner/hdf5/hdf5.h: one process-wide lock, shared with the data loader's workers),
//   taken per slab so a background write never starves the loader for long.
// - The code, by phase: file_layout (the layout, once), file_writer (creating it), write_serial,
//   write_collective, file_reader + load (reading, verifying), inspect, isolated (reading in a
//   child process), publish (the atomic protocol), snapshot (in-memory copies), state_shards
//   (shards <-> logical tensors), resume (the chooser), saver.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"
#include "runner/state.h"

namespace parallel {
class Communicator;
}

namespace runner {

class StagedState;  // staging.h

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
// The same from a staged state (staging.h: copies out of the device, waited for here first):
// what the saver writes, on the training thread or on its writer thread.
int64_t write_checkpoint_file(const std::string& path, const StagedState& state, const WriteOptions& opt);
SaveResult write_checkpoint_atomic(const std::string& dir, StagedState& state, const WriteOptions& opt);

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
// as a checkpoint at all. *ok (if given) is set to whether everything verified. `runner inspect`
// runs it in a child process (inspect_checkpoint_isolated, isolated.h).
std::string inspect_checkpoint(const std::string& path, bool* ok = nullptr);

// Keeps HDF5 from registering its exit-time cleanup (call first thing in main, before any other
// HDF5 call). Every handle the runner opens is closed by its owner; a file whose close failed
// (a disk that filled up mid-write) stays half-closed in the library, and the exit-time cleanup
// then crashes on it (SIGSEGV in H5F__close_cb) or loops ("infinite loop closing library").
void disable_hdf5_exit_cleanup();

// ---- fault injection (tests) ----
// The checkpoint's fault points. Tests set them directly; in the runner the fault hook
// (runner/train/fault_hook.h) arms them from the RUNNER_CKPT_FAULT_* knobs at start. All off
// by default.
// A write that reaches `n` bytes of tensor data (n >= 0) stops: it throws CheckpointFault, or,
// after set_write_fault_exit(true), calls _exit(137) to simulate a crash. n < 0 disables.
void set_write_fault_after_bytes(int64_t n);
// Faults at a stage of the atomic protocol instead (same throw / _exit behaviour).
enum class WriteFault { None, BeforeClose, BeforeRename, BeforeLatest, BeforeLatestRename };
void set_write_fault_at(WriteFault where);
// Whether a due write fault ends the process with _exit(137) (a crash mid-write) instead of
// throwing CheckpointFault.
void set_write_fault_exit(bool exit);
// Each save takes `ms` longer before its rename (a slow file system), so a test can signal
// while a checkpoint is being written; 0 disables.
void set_write_slow_ms(int64_t ms);
// Verifying a file whose path contains `substring` aborts, standing in for a crash inside
// libhdf5 on a damaged file; empty disables.
void set_verify_fault_abort(const std::string& substring);
struct CheckpointFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- in-memory copies ----
// A deep copy of everything a checkpoint holds (params and moments cloned into `account`, on
// their own device; gradients are not copied).
TrainState clone_state(const TrainState& s, ops::Account account);

// The cheap tier: a copy of the state in host memory every K steps, so a non-finite loss or a
// spike rolls back without touching disk. Buffers are reused when shapes do not change. Device
// tensors are staged out (queued on the device's side queue, waited for when the snapshot is
// next taken, restored or cleared: training does not wait for the copy) and copied back in.
class MemorySnapshot {
 public:
  ~MemorySnapshot() { settle(); }
  void take(const TrainState& s);
  // Copies params, moments, loader, rng, scaler, step, tokens, loss_ema back into `s` (whose
  // tensors must have the snapshot's shapes). Gradients and recipe_yaml are left alone.
  void restore(TrainState& s) const;
  bool valid() const { return valid_; }
  int64_t step() const { return state_.step; }
  size_t bytes() const;
  void clear();

 private:
  void stage(ops::Tensor& dst, const ops::Tensor& src);
  void settle() const;  // waits for the copies of the last take, if any are in flight

  TrainState state_;
  bool valid_ = false;
  mutable ops::Backend* pending_device_ = nullptr;  // a device whose copies may be in flight
  mutable uint64_t pending_fence_ = 0;
};

}  // namespace runner
