// `runner train RECIPE` and `runner resume RUN_DIR`: the options; the start-up decisions
// (layout search, allocation, backend, GEMM paths) are the train side's (Launch::train_recipe
// and Launch::resume_run in runner/train/mpi_job.h).
#include "runner/cli/command.h"
#include "runner/recipe/recipe.h"
#include "runner/train/mpi_job.h"
#include "runner/train/trainer.h"

namespace runner::cli {

namespace {

void add_diagnose_precision(CLI::App* sub, TrainOptions& topts) {
  sub->add_flag("--diagnose-precision", topts.diagnose_precision,
                "per parameter tensor and logged step: largest gradient, fraction that would underflow in fp16 at the "
                "loss scale, headroom to overflow; warns when no single scale suits every tensor (precision.diagnostics)");
}

class TrainCommand final : public Command {
 public:
  explicit TrainCommand(CLI::App& app) {
    sub_ = app.add_subcommand("train", "train a recipe (under mpirun or srun for several ranks)");
    sub_->add_option("recipe", recipe_path_, "recipe YAML")->required();
    sub_->add_option("--set", sets_, "override a recipe field, e.g. --set train.steps=100")->take_all();
    sub_->add_option("--run-dir", topts_.run_dir, "run directory (default: train.run_dir or runs/<name>)");
    sub_->add_flag("--quiet", topts_.quiet, "no progress lines on stdout (the log file keeps them)");
    sub_->add_option("--profile", topts_.profile,
                     "per-operator profile of steps FROM:TO (e.g. 20:30): forward, backward, recompute; RUN_DIR/profile.json");
    add_diagnose_precision(sub_, topts_);
    sub_->add_flag("--strict", topts_.strict, "when resuming, fail on a corrupt checkpoint instead of falling back");
    // Slurm (runner/run/slurm.h): a requeued job may come back on another number of ranks.
    sub_->add_flag("--elastic", elastic_,
                   "on a world size other than the recipe's layout (a job requeued on fewer or more ranks), continue "
                   "at the dp it gives with the same global batch, accum derived again (train.elastic)");
  }

  Start start() const override { return Start::ranks; }

  int run(std::optional<Launch>& launch) override {
    return launch->train_recipe(load_recipe(recipe_path_, sets_), topts_, elastic_);
  }

 private:
  std::string recipe_path_;
  std::vector<std::string> sets_;
  TrainOptions topts_;
  bool elastic_ = false;
};

class ResumeCommand final : public Command {
 public:
  explicit ResumeCommand(CLI::App& app) {
    sub_ = app.add_subcommand("resume", "continue a run from its last checkpoint");
    sub_->add_option("run_dir", resume_dir_, "run directory")->required();
    sub_->add_option("--step", topts_.resume_step, "resume from this step's checkpoint instead of LATEST")
        ->check(CLI::Validator(
            [](std::string& v) { return v.rfind('-', 0) == 0 ? std::string("a step is >= 0 (omit --step for LATEST)") : ""; },
            "STEP>=0"));
    sub_->add_flag("--strict", topts_.strict, "fail on a corrupt checkpoint instead of falling back");
    sub_->add_flag("--quiet", topts_.quiet, "no progress lines on stdout (the log file keeps them)");
    add_diagnose_precision(sub_, topts_);
    sub_->add_option("--set", sets_,
                     "override a field of the stored recipe, e.g. --set parallel.tp=2 to resume on another layout")
        ->take_all();
  }

  Start start() const override { return Start::ranks; }

  int run(std::optional<Launch>& launch) override {
    return launch->resume_run(resume_dir_, sets_, topts_);
  }

 private:
  std::string resume_dir_;
  std::vector<std::string> sets_;
  TrainOptions topts_;
};

}  // namespace

std::unique_ptr<Command> train_command(CLI::App& app) { return std::make_unique<TrainCommand>(app); }
std::unique_ptr<Command> resume_command(CLI::App& app) { return std::make_unique<ResumeCommand>(app); }

}  // namespace runner::cli
