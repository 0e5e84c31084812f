// Running under Slurm: the sbatch script `runner launch --slurm` writes, the allocation check
// every `runner train` makes inside a Slurm job, elastic continuation at another size, and the
// run directory's events.jsonl (one record per start and per end of a job on the run).
//
// Requeue is the generated script's job, not the runner's: on exit code 3 (preempted, a
// checkpoint published) the batch shell runs `scontrol requeue $SLURM_JOB_ID`. The shell is
// the one process that outlives every rank, so it requeues only after all ranks have exited
// and the checkpoint is on disk (a rank that requeued would have Slurm kill its peers, maybe
// mid-write), and the runner needs no Slurm commands or privileges (scripts/slurm.sbatch.in).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"

namespace runner {

// What Slurm tells a job step through its environment (in_job false outside Slurm).
struct SlurmEnv {
  bool in_job = false;
  std::string job_id, job_name, node_list;
  int64_t restart_count = 0;  // SLURM_RESTART_COUNT: times the job was requeued
  int64_t ntasks = 0;         // SLURM_NTASKS (SLURM_NPROCS): ranks in the allocation
  int64_t nnodes = 0;
};
SlurmEnv slurm_env();

// The recipe to train on `world` ranks (the MPI world; 0: one process started by hand).
// Inside a Slurm allocation a world (or SLURM_NTASKS) other than the recipe's layout is
// refused (UserError, exit 2) unless `elastic` (--elastic or train.elastic): then dp is derived
// from the world and accum from the recipe's global batch, which stays, and `notes` gets what
// changed. Outside Slurm without elastic the recipe is returned as is (mpirun derives dp as before).
Recipe fit_allocation(const Recipe& r, int64_t world, bool elastic, std::vector<std::string>* notes);

// `runner launch RECIPE --slurm`.
struct SlurmLaunchOptions {
  std::string recipe_path;          // as given (made absolute in the script)
  std::vector<std::string> sets;    // --set overrides, passed on to `runner train`
  std::string run_dir;              // --run-dir (default: the recipe's)
  std::string time = "01:00:00";    // --time
  int64_t warn_seconds = 120;       // --signal=USR1@N
  // --cpus-per-task: 0 derives it: train.threads when set, else the node's CPUs shared by the
  // ranks on it (node_cpus / tasks per node, at least 1).
  int64_t cpus_per_task = 0;
  int64_t node_cpus = 0;            // --node-cpus: CPUs of a compute node (0: this machine's)
  bool elastic = false;             // pass --elastic to `runner train`
  std::string job_name;             // default: the recipe's name
  std::string partition;            // #SBATCH --partition when given
  std::string runner_binary;        // default: this executable
  std::string template_text;        // default: the built-in scripts/slurm.sbatch.in
};
// The sbatch script for `plan` (made from the recipe with world 0): the template with its
// {{FIELDS}} filled in. Throws UserError on an option it cannot honour (a bad --time).
std::string slurm_script(const Plan& plan, const SlurmLaunchOptions& o);
std::string builtin_slurm_template();
// `runner launch`: plans the recipe (world from the recipe), fills the template (template_path,
// else the built-in one) and prints it (dry_run), or writes it to `out` (default
// RUN_DIR/slurm.sbatch) and, with `submit`, runs sbatch on it. Returns the exit code.
int launch_slurm(SlurmLaunchOptions o, const std::string& template_path, const std::string& out, bool dry_run,
                 bool submit);

// Appends one JSON record to RUN_DIR/events.jsonl (rank 0 calls it).
void append_run_event(const std::string& run_dir, nlohmann::json record);
// A start record: time, Slurm job (id, restart count, nodes, tasks), world, layout, batch, the
// step resumed from and what a layout change derived again.
nlohmann::json start_event(const Plan& plan, int64_t world, int64_t resumed_from, const std::vector<std::string>& notes);

// `runner status RUN_DIR`: whether the run is running (its lock held), finished, stopped (and
// how) or crashed; last step, last checkpoint and its age, restarts and their causes, the
// layout, the Slurm job, and the ETA while running. Throws UserError when RUN_DIR is no run
// directory.
std::string run_status(const std::string& run_dir);
nlohmann::json run_status_json(const std::string& run_dir);  // the same, as data (`--json`)

}  // namespace runner
