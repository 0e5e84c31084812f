// `runner plan RECIPE`: the recipe checked and its plan printed, as the table or as JSON (the
// run directory's plan.json). Nothing runs and nothing is written.
//
// A gate for a job script (`runner plan r.yaml && sbatch ...`): plan refuses what
// train would refuse. After printing the plan it opens the data train will read, through the
// same open_source as the trainer (a missing file, text data pointed at an HDF5 or token file,
// a token beyond the vocabulary: the same messages), and refuses a plan that does not fit the
// device; either exits 2. The plan is printed first so that a recipe planned where its data is
// not (a laptop planning a cluster job) still shows its memory; --no-data-check skips the data.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/gemm_path.h"
#include "runner/cli/command.h"
#include "runner/cli/plan_search.h"
#include "runner/data/data.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#include "runner/perf/gemm_report.h"
#include "runner/perf/search.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"

namespace runner::cli {

namespace {

// Which GEMM path each format takes on this machine, and whether 16-bit compute is slower than
// fp32 here (runner/perf/gemm_report.h): before a run, not an hour into it.
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
    sub_->add_flag("!--no-data-check", check_data_, "plan without opening the data files (train still checks them)");
    sub_->add_flag("--search", search_on_,
                   "search every layout that fits (dp, tp, pp, schedule, micro-batch, ZeRO, recompute) and rank them "
                   "by predicted step time (docs/search.md); fields the recipe writes are constraints");
    sub_->add_option("--top", search_.top, "with --search: how many layouts to show (default 5)");
    sub_->add_option("--write", search_.write, "with --search: write the recipe with the best layout filled in to this file");
    sub_->add_option("--verify", search_.verify,
                     "with --search: run the best K layouts for a few steps each (mpirun/srun at the world size) and "
                     "re-rank them by measured step time");
    sub_->add_option("--verify-steps", search_.verify_steps, "with --verify: steps per trial run (default 6)");
    sub_->add_option("--verify-dir", search_.verify_dir, "with --verify: run the trials in this directory and keep it");
    sub_->add_option("--profile", search_.profile,
                     "with --search: a hardware profile from `runner calibrate` (default: hardware.profile, else built in)");
  }

  int run(std::optional<Launch>&) override {
    try {
      ops::gemm_mode_from_env();
    } catch (const std::invalid_argument& e) {
      throw UserError({}, e.what(), "set RUNNER_GEMM_PATH to auto, onednn or sgemm, or unset it");
    }
    if (search_on_) {
      search_.recipe_path = recipe_path_;
      search_.sets = sets_;
      search_.world = world_;
      search_.json = json_;
      return run_plan_search(search_);
    }
    Recipe r = load_recipe(recipe_path_, sets_);
    std::string searched;  // parallel: auto: the search's winner is what is planned (plan_search.h)
    if (r.parallel.search) r = searched_recipe(r, world_, "--world", &searched);
    Plan p = make_plan(r, world_);
    if (!searched.empty()) p.notes.insert(p.notes.begin(), searched);
    if (json_) std::cout << p.to_json().dump(2) << "\n";
    else {
      // A GPU recipe's GEMMs are cuBLASLt's, whatever this machine's CPU would take.
      std::optional<ops::ScopedGemmPaths> gpu;
      if (device_kind(r.hardware).gpu) gpu.emplace(ops::device_gemm_paths());
      std::cout << p.table() << gemm_text(p.recipe.precision.compute);
    }
    // After the plan, so that a recipe planned on a machine without its data still shows
    // its memory; the exit code still refuses it.
    std::vector<std::string> refusals;
    if (check_data_) {
      try {
        // Both splits, as the trainer opens them (the seed only orders samples).
        for (Split split : {Split::Train, Split::Val})
          open_source(r.data, split, r.model.seq_len, r.model.vocab_size, static_cast<uint64_t>(r.train.seed));
      } catch (const UserError& e) {
        refusals.push_back(e.what());
      }
    }
    if (!p.fits) refusals.push_back(not_fit(r, p));
    if (refusals.empty()) return 0;
    std::cout.flush();
    for (const std::string& m : refusals) std::fprintf(stderr, "%s\n", m.c_str());
    if (check_data_ && refusals.size() > (p.fits ? 0u : 1u))
      std::fprintf(stderr, "(plan reads the data train will read; --no-data-check plans without it, e.g. on a "
                           "machine that does not hold the data)\n");
    return kExitUserError;
  }

 private:
  std::string recipe_path_;
  std::vector<std::string> sets_;
  bool json_ = false;
  int64_t world_ = 0;
  bool check_data_ = true;
  bool search_on_ = false;
  PlanSearchOptions search_;

  // The refusal of a plan that does not fit: the worst rank against the device, and where to look.
  std::string not_fit(const Recipe& r, const Plan& p) const {
    const StageLedger& w = p.worst_stage();
    return UserError::format(
        r.loc("hardware"),
        fmt::format("the plan does not fit: {} per rank{} against {} of device memory ({})", format_bytes(w.total()),
                    p.pp > 1 ? fmt::format(" on stage {}", w.stage) : "", format_bytes(p.device_memory), r.hardware.device),
        json_ ? "take one of the \"suggestions\" above, or plan for more devices"
              : "take one of the changes under 'what would fit' above, or plan for more devices");
  }
};

}  // namespace

std::unique_ptr<Command> plan_command(CLI::App& app) { return std::make_unique<PlanCommand>(app); }

}  // namespace runner::cli
