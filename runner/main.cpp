// The `runner` command line: plan, train, resume, inspect, data prepare.
//
// Every user error ends here as `file:line:col: what; how to fix` on stderr with exit
// code 2, before anything is allocated or written.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include "ops/backend.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/signals.h"
#include "runner/train/train.h"

using namespace runner;

namespace {

// Under mpirun/srun: every rank runs the same command. Recipe and plan errors are the same on
// every rank, so each exits with code 2 and only rank 0 prints; an error during training stops
// the whole job at once (MPI_Abort) with the failing rank's message, named by its coordinates.
struct Launch {
  std::unique_ptr<parallel::Communicator> world;
  int rank = 0, size = 1;
  Launch(int* argc, char*** argv) {
    if (!parallel::mpi_launched()) return;
    parallel::init_mpi(argc, argv);
    world = parallel::mpi_world();
    rank = world->rank();
    size = world->size();
  }
  ~Launch() { parallel::finalize_mpi(); }
};

// Prints this rank's message, named by its coordinates, and stops the whole job.
[[noreturn]] void fail_job(parallel::Grid& grid, const std::string& message, int code) {
  std::fprintf(stderr, "[rank %d %s] %s\n", grid.rank(), grid.name().c_str(), message.c_str());
  std::fflush(stderr);
  grid.world().abort(code);
  std::_Exit(code);  // not reached (abort() is [[noreturn]], which GCC does not see through a virtual call)
}

int train_on_grid(Launch& launch, const Plan& p, const TrainOptions& opts) {
  if (!launch.world) return run_training(p, opts);
  parallel::Grid grid(std::move(launch.world), {static_cast<int>(p.dp), static_cast<int>(p.tp), static_cast<int>(p.pp)});
  try {
    return run_training(p, opts, grid);
  } catch (const SilentExit& e) {
    return e.code;
  } catch (const AgreedUserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitUserError;
  } catch (const UserError& e) {  // this rank's alone: the others may be waiting in a collective
    fail_job(grid, e.what(), kExitUserError);
  } catch (const std::exception& e) {
    fail_job(grid, std::string("error: ") + e.what(), 1);
  }
}

}  // namespace

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

  std::string resume_dir;
  auto* resume_cmd = app.add_subcommand("resume", "continue a run from its last checkpoint");
  resume_cmd->add_option("run_dir", resume_dir, "run directory")->required();
  resume_cmd->add_option("--step", topts.resume_step, "resume from this step's checkpoint instead of LATEST");
  resume_cmd->add_flag("--strict", topts.strict, "fail on a corrupt checkpoint instead of falling back");
  resume_cmd->add_flag("--quiet", topts.quiet, "no progress lines on stdout (the log file keeps them)");
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUserError;
  }

  std::optional<Launch> launch;
  if (*train_cmd || *resume_cmd) launch.emplace(&argc, &argv);
  const bool quiet_rank = launch && launch->rank != 0;  // identical errors print once
  try {
    if (*train_cmd || *resume_cmd) ops::cpu_backend();  // selects OpenBLAS's kernels before any GEMM runs
    if (*plan_cmd) {
      Recipe r = load_recipe(recipe_path, sets);
      Plan p = make_plan(r, world);
      if (json) std::cout << p.to_json().dump(2) << "\n";
      else std::cout << p.table();
      return 0;
    }
    if (*train_cmd) {
      Recipe r = load_recipe(recipe_path, sets);
      Plan p = make_plan(r, launch->world ? launch->size : 0);
      return train_on_grid(*launch, p, topts);
    }
    if (*resume_cmd) {
      namespace fs = std::filesystem;
      if (!fs::is_directory(resume_dir))
        throw UserError({resume_dir, 0, 0}, "not a run directory", "pass the directory `runner train` wrote (runs/NAME)");
      // The checkpoint directory: the run's resolved recipe may place it elsewhere.
      std::string ckpt_dir = (fs::path(resume_dir) / "checkpoints").string();
      fs::path saved = fs::path(resume_dir) / "recipe.yaml";
      if (fs::exists(saved)) {
        Recipe rr = load_recipe(saved.string());
        if (!rr.checkpoint.dir.empty()) ckpt_dir = rr.checkpoint.dir;
      }
      CheckpointManager probe(ckpt_dir, CheckpointConfig{});
      if (!probe.has_checkpoints())
        throw UserError({ckpt_dir, 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
      std::string text = probe.resume_recipe_text(topts.strict, topts.resume_step);
      Recipe r = load_recipe_text(text, saved.string(), sets);
      // Resuming on another layout: the stored recipe holds the old layout's derived dp and
      // accum; unless given, they are derived again (the global batch stays).
      auto overrides = [&](const std::string& prefix) {
        for (auto& s : sets)
          if (s.rfind(prefix, 0) == 0) return true;
        return false;
      };
      if (overrides("parallel.") && !overrides("parallel.dp")) r.parallel.dp = 0;
      if (overrides("parallel.") && !overrides("batch.")) r.batch.accum = 0;
      Plan p = make_plan(r, launch->world ? launch->size : 0);
      topts.run_dir = resume_dir;
      topts.resume = true;
      return train_on_grid(*launch, p, topts);
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
