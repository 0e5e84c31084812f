// A training job's processes: one rank started by hand, or the ranks mpirun/srun started.
//
// MPI is initialised only under a launcher (parallel::mpi_launched), so a plain `runner train`
// never touches it. Recipe and plan errors are the same on every rank: each exits with code 2
// and only rank 0 prints. An error during training stops the whole job at once (MPI_Abort)
// with the failing rank's message, named by its grid coordinates.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/train/trainer.h"

namespace runner {

class Launch {
 public:
  Launch(int* argc, char*** argv);
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  int rank() const { return rank_; }
  // The job's size under a launcher; 0 when started by hand (the plan takes it from the recipe).
  int64_t world_size() const { return world_ ? size_ : 0; }
  // The world communicator, handed over (runner generate's grid); null when started by hand.
  // MPI stays initialised until this object goes.
  std::unique_ptr<parallel::Communicator> take_world() { return std::move(world_); }
  // Decides, before anything is planned, which GEMM path each 16-bit dtype takes on every rank
  // (ops/gemm_path.h): a run directory that already holds the run (a resume, a requeued job)
  // keeps the paths it recorded in gemm_paths.json, so it continues bit for bit; otherwise
  // rank 0 measures and every rank takes its choice, so all ranks and the ledger agree.
  // RUNNER_GEMM_PATH=onednn|sgemm forces a path on every rank.
  void agree_gemm_paths(const std::string& run_dir);
  // Trains `plan` on this process's rank on backend `be` (the run's choice, select_backend)
  // and returns the process exit code.
  int train(const Plan& plan, const TrainOptions& opts, ops::Backend& be);

  // `runner train`: the start-up decisions, in this order, then train(). parallel: auto
  // searches the layout at the job's size (every rank gets the same one; search.json goes
  // beside plan.json); the recipe is fitted to the Slurm allocation (`elastic`: another world
  // size keeps the global batch); the backend is chosen (a GPU device without a usable GPU is
  // exit 2 before anything is written); the ranks agree on the GEMM paths of a 16-bit run.
  int train_recipe(Recipe recipe, TrainOptions opts, bool elastic);
  // `runner resume RUN_DIR`: the stored recipe with `sets` applied and the checkpoint chosen
  // (prepare_resume), then the same backend and GEMM decisions and train().
  int resume_run(const std::string& run_dir, const std::vector<std::string>& sets, TrainOptions opts);

 private:
  std::unique_ptr<parallel::Communicator> world_;
  int rank_ = 0, size_ = 1;
};

}  // namespace runner
