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

}  // namespace runner::cli
