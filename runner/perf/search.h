// `runner plan --search`: every layout that fits, ranked by the cost model (cost.h).
//
// The space: dp, tp, pp and virtual stages under the layout rules; the schedule (1F1B, GPipe,
// interleaved); micro-batch and accumulation under the batch equation; ZeRO-1; sequence
// parallelism; recompute (none, selective sets, auto, full). A field the recipe writes
// (Recipe::locs: `parallel.tp: 8`, `batch.micro: 1`, `recompute.mode: full`) is a constraint;
// the rest is searched. Every candidate ranked goes through make_plan, the exact ledger, so a
// layout shown never runs out of memory; on a GPU a candidate whose lower bound on its step is
// above the K-th best found is skipped unplanned (it cannot be in the top K; counted apart).
// Nothing fits: a UserError naming the constraints and the nearest layouts that would fit.
// SearchResult::measured is filled by `--verify` (runner/perf/verify.h).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/perf/cost.h"
#include "runner/perf/hardware_profile.h"
#include "runner/plan/plan.h"

namespace runner {

struct SearchOptions {
  int64_t world = 0;       // 0: the recipe's hardware (nodes x devices_per_node), else the Slurm allocation, else 1
  int top = 5;             // candidates kept in SearchResult::candidates
  std::string profile;     // a calibrated profile file; empty: hardware.profile, else built in
  int threads = 0;         // planning threads; 0: every core
  bool exhaustive = false; // plan every candidate, no pruning nor bound (tests: the pruned search finds the same)
  int max_zero = 3;        // the highest ZeRO stage searched where the recipe leaves zero free (train: 1, what it runs)
};

struct SearchCandidate {
  int64_t dp = 1, tp = 1, pp = 1, virtual_stages = 1, micro = 1, accum = 1;
  int zero = 0;
  bool sequence_parallel = false;
  std::string schedule;    // "1f1b", "gpipe", "interleaved"
  std::string recompute;   // "none", "selective:attention_core,...", "auto", "full"
  Recipe recipe;           // the input recipe with this layout filled in (what --write writes)
  double memory_bytes = 0; // the worst rank's ledger total
  StepCost predicted;
  std::optional<double> measured_step_s;  // --verify
  nlohmann::json to_json() const;  // dp, tp, pp, micro, accum, zero, recompute, schedule, predicted {...}
  std::string describe() const;    // "dp 2 x tp 1 x pp 1, micro 4 x accum 8, ZeRO-1, recompute none"
};

struct SearchResult {
  int64_t world = 0;
  std::string world_source;                    // "--world", "hardware: 2 nodes x 8 devices", "Slurm allocation: ..."
  std::vector<std::string> constraints;        // "parallel.tp = 8 (recipe.yaml:12:7)", ...
  std::vector<SearchCandidate> candidates;     // best first (after --verify: by measured step)
  int64_t searched = 0, feasible = 0;  // searched = feasible + rejected + bounded
  // Skipped unplanned: a lower bound on their step (the knobs' GEMMs and attention at the
  // profile's rates, and the bubble; docs/search.md) is above the K-th best step found, so
  // they cannot be among the top K. Not planned: whether they fit is not known.
  int64_t bounded = 0;
  std::map<std::string, int64_t> rejected;     // reason ("memory", "divisibility: ...") -> count
  double seconds = 0;                          // the search's own time
  std::string profile_source;                  // HardwareProfile::source
  nlohmann::json to_json() const;              // {"search": {"candidates": [...], ...}}
  std::string table() const;                   // the human report
};

SearchResult search_layouts(const Recipe& r, const SearchOptions& opt);

// Tests: every candidate that fits, planned in the search's chain order, with the search's lower
// bounds on its step (from its knobs' GEMMs and attention alone; from the layer costs the first
// plan of its key taught, as the search learns them) beside its predicted step. On a host
// device both bounds are 0 (the search bounds nothing there).
struct BoundCheck {
  std::string layout;  // SearchCandidate::describe()
  double formula = 0, learnt = 0, predicted = 0;
};
std::vector<BoundCheck> search_bound_check(const Recipe& r, const SearchOptions& opt);

// The recipe with the candidate's layout filled in, as YAML (`--write OUT.yaml`): the input
// recipe's text with parallel, batch and recompute replaced, when that reads back as exactly
// the candidate's recipe; else (--set overrides, a recipe not read from text) the resolved
// recipe (recipe_to_yaml) under a comment saying so.
std::string write_candidate_yaml(const Recipe& r, const SearchCandidate& c);

// `parallel: auto` at `runner plan` and `runner train` start: the layout searched at `world`
// (0: the recipe's hardware, else the Slurm allocation, else 1) and the recipe with the winner filled
// in (parallel.auto off, so a run directory's recipe.yaml holds a fixed layout). `note` gets
// "layout searched: ..."; `search_json`, when given, the search's JSON (the run's search.json).
// Deterministic: every rank of a job that calls it gets the same layout.
// `world_from` names where a nonzero `world` came from ("--world", "the job's ranks").
// `max_zero`: the highest ZeRO stage searched where the recipe leaves zero free (the trainer
// passes 1: it does not yet run 2 and 3).
Recipe searched_recipe(const Recipe& r, int64_t world, const std::string& world_from, std::string* note,
                       std::string* search_json = nullptr, int max_zero = 3);

}  // namespace runner
