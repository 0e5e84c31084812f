// What a job that starts on an existing run directory keeps and says, apart from the loop:
// a finished run left as it is, a changed recipe listed field by field with the recipe the run
// ran with kept (recipe.N.yaml) and recorded (events.jsonl), a hand-edited RUN_DIR/recipe.yaml
// kept, and a resume from before the newest checkpoint keeping metrics.jsonl as it was.
//
// Design: the trainer decides when (after the lock, around the checkpoint's load, before the
// run files are written); these functions decide what, and return the lines the user must
// see, so the trainer puts them on its log (and on stderr under --quiet) in one place. Rank 0
// alone calls them. The comparisons and the numbered copies are runner/run/recipe_history.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runner/checkpoint/resume.h"
#include "runner/recipe/recipe.h"
#include "runner/run/recipe_history.h"

namespace runner {

// The message of a run with nothing to do (its checkpoint at or past r.train.steps, its end
// recorded): that it is finished, that nothing changed, and the --set that extends it.
std::string finished_message(const std::string& run_dir, const ResumePoint& point, const Recipe& r);

// This job's recipe against the one the run ran with.
class RecipeHistory {
 public:
  // `base`: the recipe the run ran with (its checkpoint's; without one RUN_DIR/recipe.yaml's;
  // empty: a new run); `now`: this job's, resolved; `from_step`: the checkpoint's step, -1: none.
  RecipeHistory(std::string run_dir, std::string base, std::string now, int64_t from_step);
  bool changed() const { return !changes_.empty(); }
  // The lines that list the changes (none when there are none).
  std::vector<std::string> said() const;
  // Once the checkpoint is loaded, before the run files are written: the recipe the run ran
  // with kept as recipe.N.yaml and the change recorded in events.jsonl when this job changes
  // it (`notes` gains the start record's note), and a RUN_DIR/recipe.yaml edited by hand kept
  // too. Returns the lines to warn with.
  std::vector<std::string> keep(std::vector<std::string>& notes) const;

 private:
  std::vector<std::string> keep_edited(const std::string& stored) const;
  std::string run_dir_, base_, now_;
  int64_t from_step_;
  std::vector<RecipeChange> changes_;
};

// A resume from `resumed_from`, before the run's newest checkpoint (`runner resume --step`, or
// a fallback past a corrupt one): metrics.jsonl is kept as metrics.N.jsonl before its later
// records are replaced, and the lines name the checkpoints this run will replace. No lines: it
// resumes from the newest.
std::vector<std::string> keep_later_history(const std::string& run_dir, const std::string& checkpoint_dir,
                                            int64_t resumed_from);

}  // namespace runner
