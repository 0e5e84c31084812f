// The `runner` command line: plan, train, resume, inspect, data prepare.
//
// Every user error ends here as `file:line:col: what; how to fix` on stderr with exit
// code 2, before anything is allocated or written.
#include <cstdio>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "ops/backend.h"
#include "ops/gemm_path.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/policy.h"
#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/report/report.h"
#include "runner/signals.h"
#include "runner/train/launch.h"

using namespace runner;

int main(int argc, char** argv) {
  CLI::App app{"runner: a declarative training job runner for transformer language models"};
  app.set_version_flag("--version", std::string("runner ") + RUNNER_VERSION);
  app.require_subcommand(1);

  std::string recipe_path;
  std::vector<std::string> sets;
  bool json = false;
  int64_t world = 0;
  auto* plan_cmd = app.add_subcommand("plan", "check a recipe and print its plan and per-rank memory ledger");
  plan_cmd->add_option("recipe", recipe_path, "recipe YAML")->required();
  plan_cmd->add_option("--set", sets, "override a recipe field, e.g. --set batch.micro=8")->take_all();
  plan_cmd->add_flag("--json", json, "print the plan as JSON (the same as the run directory's plan.json)");
  plan_cmd->add_option("--world", world, "plan for this many ranks (default: from the recipe)");

  TrainOptions topts;
  auto* train_cmd = app.add_subcommand("train", "train a recipe (under mpirun or srun for several ranks)");
  train_cmd->add_option("recipe", recipe_path, "recipe YAML")->required();
  train_cmd->add_option("--set", sets, "override a recipe field, e.g. --set train.steps=100")->take_all();
  train_cmd->add_option("--run-dir", topts.run_dir, "run directory (default: train.run_dir or runs/<name>)");
  train_cmd->add_flag("--quiet", topts.quiet, "no progress lines on stdout (the log file keeps them)");
  train_cmd->add_option("--profile", topts.profile,
                        "per-operator profile of steps FROM:TO (e.g. 20:30): forward, backward, recompute; RUN_DIR/profile.json");

  std::string resume_dir;
  auto* resume_cmd = app.add_subcommand("resume", "continue a run from its last checkpoint");
  resume_cmd->add_option("run_dir", resume_dir, "run directory")->required();
  resume_cmd->add_option("--step", topts.resume_step, "resume from this step's checkpoint instead of LATEST");
  resume_cmd->add_flag("--strict", topts.strict, "fail on a corrupt checkpoint instead of falling back");
  resume_cmd->add_flag("--quiet", topts.quiet, "no progress lines on stdout (the log file keeps them)");
  for (CLI::App* c : {train_cmd, resume_cmd})
    c->add_flag("--diagnose-precision", topts.diagnose_precision,
                "per parameter tensor and logged step: largest gradient, fraction that would underflow in fp16 at the "
                "loss scale, headroom to overflow; warns when no single scale suits every tensor (precision.diagnostics)");
  resume_cmd->add_option("--set", sets,
                         "override a field of the stored recipe, e.g. --set parallel.tp=2 to resume on another layout")
      ->take_all();
  train_cmd->add_flag("--strict", topts.strict, "when resuming, fail on a corrupt checkpoint instead of falling back");

  std::string ckpt_path;
  auto* inspect_cmd = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
  inspect_cmd->add_option("checkpoint", ckpt_path, "checkpoint .h5 file")->required();

  std::string text_path, out_path;
  auto* data_cmd = app.add_subcommand("data", "data utilities");
  data_cmd->require_subcommand(1);
  auto* prep_cmd = data_cmd->add_subcommand("prepare", "turn a text file into an HDF5 token dataset (byte-level)");
  prep_cmd->add_option("text", text_path, "UTF-8 text file")->required();
  prep_cmd->add_option("out", out_path, "output .h5 file")->required();

  std::string report_dir;  // runner report RUN_DIR
  auto* report_cmd = app.add_subcommand("report", "write RUN_DIR/report.html: curves, breakdown, memory, operators, alerts (one self-contained file)");
  report_cmd->add_option("run_dir", report_dir, "run directory (runs/NAME)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUserError;
  }

  std::optional<Launch> launch;
  if (*train_cmd || *resume_cmd) launch.emplace(&argc, &argv);
  const bool quiet_rank = launch && launch->rank() != 0;  // identical errors print once
  try {
    if (*train_cmd || *resume_cmd) ops::cpu_backend();  // selects OpenBLAS's kernels before any GEMM runs
    if (*plan_cmd) {
      try {
        ops::gemm_mode_from_env();
      } catch (const std::invalid_argument& e) {
        throw UserError({}, e.what(), "set RUNNER_GEMM_PATH to auto, onednn or sgemm, or unset it");
      }
      Plan p = make_plan(load_recipe(recipe_path, sets), world);
      if (json) std::cout << p.to_json().dump(2) << "\n";
      else std::cout << p.table();
      return 0;
    }
    if (*train_cmd) {
      Recipe recipe = load_recipe(recipe_path, sets);
      if (recipe.precision.compute != FloatFormat::fp32) launch->agree_gemm_paths(run_paths(recipe, topts.run_dir).run_dir);
      return launch->train(make_plan(recipe, launch->world_size()), topts);
    }
    if (*resume_cmd) {
      ResumeRequest req = prepare_resume(resume_dir, sets, topts.resume_step, topts.strict);
      topts.run_dir = resume_dir;
      topts.resume = true;
      topts.resume_point = req.point;
      topts.resume_notes = req.notes;
      if (req.recipe.precision.compute != FloatFormat::fp32) launch->agree_gemm_paths(resume_dir);
      return launch->train(make_plan(req.recipe, launch->world_size()), topts);
    }
    if (*report_cmd) {
      ReportInfo r = write_report(report_dir);
      std::cout << "wrote " << r.path.string() << " (" << r.steps << " steps" << (r.finished ? "" : ", run in progress")
                << (r.profiled ? ", profiled" : "") << ")\n";
      return 0;
    }
    if (*inspect_cmd) {
      bool ok = false;
      std::cout << inspect_checkpoint(ckpt_path, &ok);
      return ok ? 0 : kExitUserError;
    }
    if (*prep_cmd) {
      install_signal_handlers();
      int64_t n = prepare_text_to_hdf5(text_path, out_path, &stop_flag());
      std::cout << "wrote " << n << " tokens to " << out_path << "\n";
      return 0;
    }
  } catch (const UserError& e) {
    std::cout.flush();
    if (!quiet_rank) std::fprintf(stderr, "%s\n", e.what());
    return kExitUserError;
  }
  return 0;
}
