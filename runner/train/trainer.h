// `runner train` and `runner resume`: training on this process's rank of a job.
//
// The pieces: trainer.cpp (the step loop), rank_model (this rank's graphs, executors,
// gradient sync and pipeline), evaluate (held-out loss and task accuracy), rollback (the
// in-memory snapshot tier), fault_hook (test faults), startup (banner, run files, end event),
// launch (MPI under mpirun/srun, the job's grid); the observers in runner/observe/ (metrics,
// monitor, the step timer and the tracer); runner/checkpoint/resume and saver (resume point,
// save paths, cadence) and runner/run/run_dir (the run directory).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ops/backend.h"
#include "parallel/grid.h"
#include "runner/checkpoint/resume.h"
#include "runner/errors.h"
#include "runner/plan/plan.h"

namespace runner {

struct TrainOptions {
  std::string run_dir;       // empty: recipe.train.run_dir, else runs/<name>
  bool resume = false;       // continue from the run directory's checkpoints (an error when there are none)
  int64_t resume_step = -1;  // -1: LATEST
  bool strict = false;       // a corrupt checkpoint is an error instead of a fallback
  bool quiet = false;        // no progress lines on stdout (the log file still gets them)
  bool diagnose_precision = false;  // per-tensor gradient range per logged step (precision.diagnostics)
  std::string profile;       // --profile FROM:TO: per-operator profile of those steps (runner/observe/op_profile.h)
  // The checkpoint to continue from, when already chosen (`runner resume` chooses it to read
  // its recipe); otherwise the trainer asks the resume chooser.
  std::optional<ResumePoint> resume_point;
  std::vector<std::string> resume_notes;  // what a resume on another layout derived again (logged)
};

// Runs training on this rank of `grid` (every rank of the job calls it) on backend `be`, the
// one the run chose at start (runner/device/device.h); returns the process
// exit code (0 done, 2 bad input, 3 preempted, 4 stopped on fp16 overflows). A UserError that another rank hit first ends
// this rank with SilentExit (that rank prints the message; runner/agree.h).
int run_training(const Plan& plan, const TrainOptions& opts, parallel::Grid& grid, ops::Backend& be);
// One rank, no MPI.
int run_training(const Plan& plan, const TrainOptions& opts, ops::Backend& be);

}  // namespace runner
