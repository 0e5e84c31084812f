// At the start of `runner train` under Slurm: an attempt that vanished without a record (a node
// failure took the batch host or the job, and Slurm requeued it by itself) is a restart the batch
// script never judged. The same policy judges it here (runner/run/restart.h): the restart is
// recorded with its cause, what is left of its backoff is waited, or the run refuses to go on.
// A change in the number of nodes is recorded as `shrink` or `grow`.
#pragma once
#include "parallel/comm.h"
#include "runner/recipe/recipe.h"
#include "runner/run/run_dir.h"

namespace runner {

// A collective on `world`: every rank reads the records before rank 0 writes its own. Returns
// 0 to go on, or the exit code (kExitNoRestart) when the restart is refused (rank 0 says why).
int judge_requeued_start(parallel::Communicator& world, const Recipe& r, const RunPaths& paths);

}  // namespace runner
