// `runner plan --search --verify K`: the top K layouts run for a few steps each (under mpirun,
// or srun inside a Slurm allocation, at the search's world size) and re-ranked by measured
// step time, predicted printed beside measured: model-based pruning, then a short measurement.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/perf/search.h"

namespace runner {

struct VerifyOptions {
  int k = 3;              // how many of the top candidates to run
  int steps = 6;          // steps per run (the first ones, warm-up, are not timed)
  std::string runner;     // this runner's executable (/proc/self/exe)
  std::string work_dir;   // where the trial runs' directories go (empty: a temporary directory)
  bool keep = false;      // keep work_dir afterwards (always kept when the user named it)
  double timeout_s = 900; // a trial running longer is stopped and reported as failed
};

// What the trials found, beside SearchResult (whose candidates they re-ranked).
struct VerifyReport {
  int k = 0, steps = 0, warmup = 0;          // trials run, steps each, steps not timed
  std::string work_dir;                      // where the trials ran ("" once removed)
  std::vector<std::string> errors;           // per candidate, in the re-ranked order; "" when none
};

// Runs the top k of `result`, fills their measured_step_s and re-sorts result.candidates by it
// (unmeasured ones after, in predicted order). Prints progress to stderr. A trial that fails is
// reported (its error in the report) and ranked last. Throws UserError on options it cannot honour.
VerifyReport verify_layouts(SearchResult& result, const VerifyOptions& opt);

// The layout in words: "dp 2 x tp 1 x pp 1, micro 4 x accum 1, zero 0, 1f1b, recompute none".
std::string layout_words(const SearchCandidate& c);
// Steps not timed in a trial of `steps` steps (the first ones warm caches and pools).
int verify_warmup(int steps);
// The median of metrics.jsonl's step times (step_ms, seconds returned) after `warmup` steps;
// nullopt when the file has none.
std::optional<double> median_step_s(const std::string& metrics_jsonl, int warmup);
// The command that runs `args` on `world` ranks: srun inside a Slurm allocation, else mpirun,
// or the runner alone for a world of 1.
std::vector<std::string> trial_launcher(int64_t world);

// The report's human table: rank, layout, predicted, measured, measured/predicted, error.
std::string verify_table(const SearchResult& result, const VerifyReport& report);
// Adds measured_step_s, measured_over_predicted and verify_error to each of
// j["search"]["candidates"][i] (the re-ranked order), and j["search"]["verify"].
void add_verify_json(nlohmann::json& j, const SearchResult& result, const VerifyReport& report);

}  // namespace runner
