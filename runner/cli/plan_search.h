// `runner plan RECIPE --search ...`: the layout search's command-line part (plan.cpp parses the
// options; plan_search.cpp runs the search, --verify and --write and prints the result).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"

namespace runner::cli {

struct PlanSearchOptions {
  std::string recipe_path;
  std::vector<std::string> sets;
  int64_t world = 0;
  int top = 5;
  bool json = false;
  std::string write;    // --write OUT.yaml
  int verify = 0;       // --verify K
  int verify_steps = 6; // --verify-steps N
  std::string verify_dir;  // --verify-dir DIR: the trial runs go there and are kept
  std::string profile;  // --profile FILE
};

// Returns the exit code (0, or 2 for a user error thrown as UserError).
int run_plan_search(const PlanSearchOptions& o);

// `parallel: auto` at `runner plan` and `runner train` start: the layout searched at `world`
// (0: the recipe's hardware, else the Slurm allocation, else 1) and the recipe with the winner filled
// in (parallel.auto off, so a run directory's recipe.yaml holds a fixed layout). `note` gets
// "layout searched: ..."; `search_json`, when given, the search's JSON (the run's search.json).
// Deterministic: every rank of a job that calls it gets the same layout.
// `world_from` names where a nonzero `world` came from ("--world", "the job's ranks").
Recipe searched_recipe(const Recipe& r, int64_t world, const std::string& world_from, std::string* note,
                       std::string* search_json = nullptr);

}  // namespace runner::cli
