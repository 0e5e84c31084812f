// The checkpoint policy of a run, in one place: where the run directory and its checkpoints
// live, which checkpoint a run continues from (chosen once, by choose_resume_point, for
// `runner resume` and for a `runner train` that finds checkpoints), which of the three save
// paths a save takes, and when a save is due.
//
// The save paths: one rank writes its own state (the serial writer, synchronous or in the
// background); several ranks write their slices of every logical tensor into one file with
// parallel HDF5 (save_sharded); asynchronous saves across ranks gather the logical state on
// rank 0, whose writer thread saves it while training continues (collective MPI-IO cannot
// run behind the training thread's own collectives).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/grid.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}

namespace runner {

struct RunPaths {
  std::string run_dir;         // --run-dir, else train.run_dir, else runs/<name>
  std::string checkpoint_dir;  // checkpoint.dir, else RUN_DIR/checkpoints
};
RunPaths run_paths(const Recipe& r, const std::string& cli_run_dir = "");

// The checkpoint a run continues from.
struct ResumePoint {
  std::string path;
  int64_t step = -1;
  std::vector<std::string> skipped;  // newer checkpoints that did not verify, and why (logged by the trainer)
};
// Chooses it once: LATEST (or step_<step>.h5 when step >= 0) if it verifies, else the newest
// older one that does; strict: a checkpoint that does not verify is the error. nullopt: the
// directory holds no checkpoint. Throws UserError when none verifies. Reads nothing but
// `checkpoint_dir` and writes nothing; `log` (default: spdlog's) hears about a missing LATEST.
// Resume verification runs in a child process so that a file that crashes HDF5 is one that does
// not verify: forked without MPI; under MPI a fresh process of `exe` (the runner binary, whose
// hidden command `__verify-checkpoint FILE` prints verify_record's result), started with
// posix_spawn. The runner's main sets it; without it (a test binary under mpirun) verification
// under MPI stays in-process.
void set_checkpoint_verifier(const std::string& exe);
// What the verifying child sends: "O", or "E" problem NUL fix.
std::string verify_record(const std::string& path);

std::optional<ResumePoint> choose_resume_point(const std::string& checkpoint_dir, int64_t step, bool strict,
                                               std::shared_ptr<spdlog::logger> log = nullptr);

// `runner resume RUN_DIR [--set ...]`: the recipe stored in the checkpoint chosen to continue
// from, with the user's overrides. The stored recipe holds the dp and accum its layout derived;
// when the overrides change the layout (any parallel.* field), both are derived again unless
// the overrides give them (the global batch stays). Throws UserError (not a run directory, no
// checkpoint, none verifies).
struct ResumeRequest {
  Recipe recipe;
  ResumePoint point;
  std::vector<std::string> notes;  // what the overrides changed and what was derived again (logged by the trainer)
};
ResumeRequest prepare_resume(const std::string& run_dir, const std::vector<std::string>& overrides, int64_t step,
                             bool strict);

// A run's checkpoints on every rank of `grid` (calls marked collective are made by all ranks).
class CheckpointPolicy {
 public:
  CheckpointPolicy(const Plan& plan, parallel::Grid& grid, std::string checkpoint_dir,
                   std::shared_ptr<spdlog::logger> log);
  const std::string& dir() const { return mgr_.dir(); }

  // Collective: loads this rank's slices of `point` into `st` (one rank: its own tensors; several:
  // the logical tensors of its parameters, from any layout) and checks that every rank loaded
  // the same step. Returns that step.
  int64_t resume(const ResumePoint& point, TrainState& st);
  // Collective: whether a save is due after `step`, `elapsed_seconds` into the run (rank 0
  // decides: time-based cadences differ between ranks' clocks).
  bool due(int64_t step, double elapsed_seconds);
  // Collective: saves `st` along the path the layout and checkpoint.async call for. final:
  // synchronous and durable (published) on every rank's return. A write that fails (disk
  // full, permissions) throws UserError naming the path and the cause.
  void save(const TrainState& st, bool final);
  double last_stall_ms() const;  // rank 0: how long the last save blocked training
  void poll();                   // rank 0: rethrows a failed background write (as UserError)
  void remove_stale_files();     // rank 0: temporary files of writes that were killed

 private:
  const Plan& plan_;
  parallel::Grid& grid_;
  CheckpointManager mgr_;
  void save_unchecked(const TrainState& st, bool final);
  bool multi() const { return grid_.world_size() > 1; }
  bool lead() const { return grid_.rank() == 0; }
};

}  // namespace runner
