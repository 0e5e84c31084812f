// `runner train`: the training loop of one rank over the plan's graph.
#pragma once
#include <cstdint>
#include <string>

#include "parallel/grid.h"
#include "runner/errors.h"
#include "runner/plan/plan.h"

namespace runner {

struct TrainOptions {
  std::string run_dir;       // empty: recipe.train.run_dir, else runs/<name>
  bool resume = false;       // continue from the run directory's checkpoints
  int64_t resume_step = -1;  // -1: LATEST
  bool strict = false;       // a corrupt checkpoint is an error instead of a fallback
  bool quiet = false;        // no progress lines on stdout (the log file still gets them)
};

// Runs training on this rank of `grid` (every rank of the job calls it); returns the process
// exit code (0 done, 2 bad input, 3 preempted). A UserError that another rank hit first ends
// this rank with SilentExit (that rank prints the message).
int run_training(const Plan& plan, const TrainOptions& opts, parallel::Grid& grid);
// One rank, no MPI.
int run_training(const Plan& plan, const TrainOptions& opts);

struct SilentExit {
  int code;
};
// A user error that every rank has agreed on (all stop with code 2; this rank prints it).
struct AgreedUserError : UserError {
  explicit AgreedUserError(const UserError& e) : UserError(e) {}
};

// Default run directory for a recipe.
std::string default_run_dir(const Recipe& r);

}  // namespace runner
