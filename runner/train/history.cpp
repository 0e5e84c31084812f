// What a job on an existing run directory keeps and says (see history.h).
#include "runner/train/history.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runner/checkpoint/checkpoint.h"
#include "runner/run/slurm.h"

namespace runner {

std::string finished_message(const std::string& run_dir, const ResumePoint& point, const Recipe& r) {
  const int64_t more = std::max<int64_t>(2 * point.step, point.step + 1);
  return fmt::format(
      "{}: the run is finished: its last checkpoint is step {}{} ({}); nothing to do, nothing was changed.\n"
      "  to train it further, raise train.steps: `runner resume {} --set train.steps={}`{}\n",
      run_dir, point.step,
      point.step == r.train.steps ? fmt::format(" of train.steps {}", r.train.steps)
                                  : fmt::format(", past train.steps {}", r.train.steps),
      point.path, run_dir, more,
      r.optimizer.schedule.kind == LrSchedule::constant
          ? std::string()
          : fmt::format(" (the {} schedule then decays over the new total)", to_string(r.optimizer.schedule.kind)));
}

RecipeHistory::RecipeHistory(std::string run_dir, std::string base, std::string now, int64_t from_step)
    : run_dir_(std::move(run_dir)), base_(std::move(base)), now_(std::move(now)), from_step_(from_step) {
  if (!base_.empty()) changes_ = recipe_changes(base_, now_);
}

std::vector<std::string> RecipeHistory::said() const {
  if (changes_.empty()) return {};
  const size_t n = changes_.size();
  std::vector<std::string> lines{
      from_step_ >= 0 ? fmt::format("the recipe differs from the one this run ran with up to step {} (its checkpoint's): "
                                    "{} field{} changed (to start over instead, give another --run-dir)",
                                    from_step_, n, n == 1 ? "" : "s")
                      : fmt::format("the recipe differs from the one this run directory last ran with ({}/recipe.yaml): "
                                    "{} field{} changed", run_dir_, n, n == 1 ? "" : "s")};
  for (const RecipeChange& c : changes_) lines.push_back("  " + describe_change(c));
  return lines;
}

std::vector<std::string> RecipeHistory::keep(std::vector<std::string>& notes) const {
  const std::string stored = stored_recipe_text(run_dir_);
  if (!changes_.empty()) {
    const std::string kept = keep_numbered_text(run_dir_, "recipe", "yaml", base_);
    nlohmann::json list = nlohmann::json::array();
    std::vector<std::string> said;
    for (const RecipeChange& c : changes_) {
      list.push_back({{"field", c.field}, {"was", c.was}, {"now", c.now}});
      said.push_back(describe_change(c));
    }
    append_run_event(run_dir_, {{"event", "recipe_changed"}, {"step", std::max<int64_t>(from_step_, 0)},
                                {"changes", list}, {"earlier", kept}});
    notes.push_back(fmt::format("continuing with a changed recipe ({}); the earlier one is kept as {}/{}",
                                fmt::join(said, ", "), run_dir_, kept));
  }
  if (stored.empty() || stored == now_ || stored == base_) return {};
  return keep_edited(stored);
}

// RUN_DIR/recipe.yaml says what neither the checkpoint nor this job runs: an edit by hand,
// which `runner resume` does not read (it continues with the checkpoint's recipe and --set).
std::vector<std::string> RecipeHistory::keep_edited(const std::string& stored) const {
  const std::string kept = keep_numbered_text(run_dir_, "recipe", "yaml", stored);
  const std::vector<RecipeChange> edits = recipe_changes(now_, stored);  // what the file would change
  std::string sets;
  for (const RecipeChange& c : edits)
    if (c.now != "(unset)")
      sets += fmt::format(" {}={}", c.field, c.now.find(' ') == std::string::npos ? c.now : "'" + c.now + "'");
  std::vector<std::string> lines{fmt::format(
      "{}/recipe.yaml differs from the recipe this job runs (value run <- file value below); it is kept as {}/{} and "
      "replaced. `runner resume` continues with the recipe stored in its checkpoint; to apply the file's values: "
      "`runner resume {} --set{}`", run_dir_, run_dir_, kept, run_dir_, sets)};
  for (const RecipeChange& c : edits) lines.push_back(fmt::format("  {} {} <- {}", c.field, c.was, c.now));
  return lines;
}

std::vector<std::string> keep_later_history(const std::string& run_dir, const std::string& checkpoint_dir,
                                            int64_t resumed_from) {
  if (resumed_from < 0) return {};
  std::vector<std::string> newer;
  for (int64_t s : list_checkpoint_steps(checkpoint_dir))
    if (s > resumed_from) newer.push_back(std::to_string(s));
  if (newer.empty()) return {};
  const std::string kept = keep_numbered_copy(run_dir, "metrics", "jsonl");
  const bool one = newer.size() == 1;
  return {fmt::format(
      "resuming from step {}, before this run's newest checkpoint (step {}): {}the checkpoint{} of step{} {} {} replaced "
      "when this run reaches {} (copy {} elsewhere to keep {})", resumed_from, newer.back(),
      kept.empty() ? "" : fmt::format("metrics.jsonl's records after step {} are replaced as the run goes on (the file "
                                      "as it was is kept as {}/{}); ", resumed_from, run_dir, kept),
      one ? "" : "s", one ? "" : "s", fmt::join(newer, ", "), one ? "is" : "are", one ? "it" : "them",
      one ? "it" : "them", one ? "it" : "them")};
}

}  // namespace runner
