// `runner plan RECIPE`: the recipe checked and its plan printed, as the table or as JSON (the
// run directory's plan.json). Nothing runs and nothing is written.
#include <iostream>
#include <stdexcept>

#include "ops/gemm_path.h"
#include "runner/cli/command.h"
#include "runner/device/gemm_report.h"
#include "runner/errors.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"

namespace runner::cli {

namespace {

// Which GEMM path each format takes on this machine, and whether 16-bit compute is slower than
// fp32 here (runner/device/gemm_report.h): before a run, not an hour into it.
std::string gemm_text(FloatFormat compute) {
  const GemmReport g = gemm_report(compute);
  std::string s;
  for (size_t i = 0; i < g.lines.size(); ++i) s += (i == 0 ? "  GEMM       " : "             ") + g.lines[i] + "\n";
  if (!g.warning.empty()) s += "  warning: " + g.warning + "\n";
  return s;
}

class PlanCommand final : public Command {
 public:
  explicit PlanCommand(CLI::App& app) {
    sub_ = app.add_subcommand("plan", "check a recipe and print its plan and per-rank memory ledger");
    sub_->add_option("recipe", recipe_path_, "recipe YAML")->required();
    sub_->add_option("--set", sets_, "override a recipe field, e.g. --set batch.micro=8")->take_all();
    sub_->add_flag("--json", json_, "print the plan as JSON (the same as the run directory's plan.json)");
    sub_->add_option("--world", world_, "plan for this many ranks (default: from the recipe)");
  }

  int run(std::optional<Launch>&) override {
    try {
      ops::gemm_mode_from_env();
    } catch (const std::invalid_argument& e) {
      throw UserError({}, e.what(), "set RUNNER_GEMM_PATH to auto, onednn or sgemm, or unset it");
    }
    Plan p = make_plan(load_recipe(recipe_path_, sets_), world_);
    if (json_) std::cout << p.to_json().dump(2) << "\n";
    else std::cout << p.table() << gemm_text(p.recipe.precision.compute);
    return 0;
  }

 private:
  std::string recipe_path_;
  std::vector<std::string> sets_;
  bool json_ = false;
  int64_t world_ = 0;
};

}  // namespace

std::unique_ptr<Command> plan_command(CLI::App& app) { return std::make_unique<PlanCommand>(app); }

}  // namespace runner::cli
