// `runner launch RECIPE --slurm`: the batch script that trains a recipe under Slurm, written,
// printed or submitted; and `runner status RUN_DIR`: where a run stands (runner/run/slurm.h).
#include <cmath>
#include <filesystem>
#include <iostream>

#include "runner/cli/command.h"
#include "runner/recipe/recipe.h"
#include "runner/run/restart.h"
#include "runner/run/run_dir.h"
#include "runner/run/slurm.h"

namespace runner::cli {

namespace {

class LaunchCommand final : public Command {
 public:
  explicit LaunchCommand(CLI::App& app) {
    sub_ = app.add_subcommand("launch", "write, print or submit the batch script that trains a recipe under Slurm");
    sub_->add_option("recipe", o_.recipe_path, "recipe YAML")->required();
    sub_->add_flag("--slurm", slurm_, "an sbatch script (Slurm is the one scheduler so far)")->required();
    sub_->add_option("--set", o_.sets, "override a recipe field (passed on to `runner train`)")->take_all();
    sub_->add_option("--run-dir", o_.run_dir, "run directory (default: train.run_dir or runs/<name>)");
    sub_->add_option("--time", o_.time, "wall-clock limit (sbatch --time), e.g. 04:00:00")->capture_default_str();
    sub_->add_option("--warn", o_.warn_seconds, "seconds before the limit at which the ranks are told to checkpoint "
                                                "and exit (--signal=USR1@N)")->capture_default_str();
    sub_->add_option("--cpus-per-task", o_.cpus_per_task,
                     "cores per rank (default: train.threads, else the node's CPUs / ranks per node)");
    sub_->add_option("--node-cpus", o_.node_cpus, "CPUs of one compute node (default: this machine's)");
    sub_->add_option("--partition", o_.partition, "Slurm partition");
    sub_->add_option("--job-name", o_.job_name, "job name (default: the recipe's name)");
    sub_->add_flag("--elastic", o_.elastic, "a requeued or resubmitted job may continue on another number of ranks");
    sub_->add_option("--template", template_path_, "your own template (default: the built-in scripts/slurm.sbatch.in)");
    sub_->add_option("-o,--output", script_out_, "where to write the script (default: RUN_DIR/slurm.sbatch)");
    sub_->add_flag("--dry-run", dry_run_, "print the script and write nothing");
    sub_->add_flag("--submit", submit_, "write the script and submit it with sbatch");
  }

  int run(std::optional<Launch>&) override { return launch_slurm(o_, template_path_, script_out_, dry_run_, submit_); }

 private:
  SlurmLaunchOptions o_;
  std::string script_out_, template_path_;
  bool slurm_ = false, dry_run_ = false, submit_ = false;
};

class StatusCommand final : public Command {
 public:
  explicit StatusCommand(CLI::App& app) {
    sub_ = app.add_subcommand("status", "where a run stands: running, finished, stopped or crashed; step, checkpoint, restarts, Slurm job, ETA");
    sub_->add_option("run_dir", run_dir_, "run directory")->required();
    sub_->add_flag("--json", json_, "print it as JSON");
  }

  int run(std::optional<Launch>&) override {
    if (json_) std::cout << run_status_json(run_dir_).dump(2) << "\n";
    else std::cout << run_status(run_dir_);
    return 0;
  }

 private:
  std::string run_dir_;
  bool json_ = false;
};

// `runner restart-check RECIPE --run-dir DIR --exit-code RC ...` (hidden): the batch script asks,
// once srun has returned with a failure, whether to requeue the job (runner/run/restart.h).
// Records the restart or the refusal in events.jsonl and says it on stderr (the job's output).
// Exit 0 with the backoff in whole seconds on stdout: requeue; 1: do not.
class RestartCheckCommand final : public Command {
 public:
  explicit RestartCheckCommand(CLI::App& app) {
    sub_ = app.add_subcommand("restart-check", "(for the batch script) whether a failed Slurm job is requeued");
    sub_->group("");  // plumbing: not in --help
    sub_->add_option("recipe", recipe_path_, "recipe YAML (as the script trains it)")->required();
    sub_->add_option("--set", sets_, "the script's recipe overrides")->take_all();
    sub_->add_option("--run-dir", run_dir_, "run directory")->required();
    sub_->add_option("--exit-code", o_.srun_code, "srun's exit code")->required();
    sub_->add_option("--rank-exits", rank_exits_, "the ranks' own exit codes (RUNNER_EXIT_RECORD)");
    sub_->add_option("--job-state", o_.job_state, "scontrol's JobState of this job now");
    sub_->add_flag("--term", o_.term_signal, "the batch shell got SIGTERM");
    sub_->add_option("--node-states", node_states_, "`sinfo -h -N -o '%N %T'`, lines joined by ';'");
  }

  int run(std::optional<Launch>&) override {
    const Recipe r = load_recipe(recipe_path_, sets_);
    const RunPaths paths = run_paths(r, run_dir_);
    if (!rank_exits_.empty()) o_.rank_codes = read_rank_exits(rank_exits_);
    o_.nodes_down = down_nodes(node_states_);
    const RestartDecision d = decide_after_attempt(read_run_history(paths.run_dir, paths.checkpoint_dir),
                                                   restart_policy(r), o_, slurm_env());
    // A run that never started (exit 2 before anything was written) gets no records: only the message.
    const bool started = std::filesystem::exists(std::filesystem::path(paths.run_dir) / "events.jsonl");
    if (!d.record.is_null() && (started || d.action == RestartDecision::Action::restart))
      append_run_event(paths.run_dir, d.record);
    std::cerr << "runner restart-check: " << d.message << "\n";
    if (d.action != RestartDecision::Action::restart) return 1;
    std::cout << static_cast<long long>(std::ceil(d.backoff_s)) << "\n";
    return 0;
  }

 private:
  std::string recipe_path_, run_dir_, rank_exits_, node_states_;
  std::vector<std::string> sets_;
  AttemptOutcome o_;
};

}  // namespace

std::unique_ptr<Command> restart_check_command(CLI::App& app) { return std::make_unique<RestartCheckCommand>(app); }

std::unique_ptr<Command> launch_command(CLI::App& app) { return std::make_unique<LaunchCommand>(app); }
std::unique_ptr<Command> status_command(CLI::App& app) { return std::make_unique<StatusCommand>(app); }

}  // namespace runner::cli
