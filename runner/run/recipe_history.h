// What a run directory remembers of the recipes that ran in it, and whether its run is done.
//
// Design: RUN_DIR/recipe.yaml is the recipe of the latest job on the directory, resolved (every
// default filled in), so two of them compare field by field as text: both are flattened to
// dotted keys and compared value by value, which needs no knowledge of the fields and stays
// right as fields are added. A job that starts with a recipe other than the one the run ran
// with keeps that one as recipe.N.yaml (N = 1, 2, ... in order) before it writes its own, and
// says which fields changed (the trainer logs them and records them in events.jsonl), so no
// recipe a run trained with is lost. "Ended" is read from metrics.jsonl: a finished run wrote its
// final evaluation and summary there (a job that continues a run drops the summary of the one
// before, and the evaluations after its checkpoint).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace runner {

struct RecipeChange {
  std::string field;  // dotted key, e.g. "optimizer.lr"; list items as "recompute.layers"
  std::string was;    // "(unset)" when the field is new
  std::string now;    // "(unset)" when the field is gone
};

// The fields whose values differ between two resolved recipes (YAML text), in the order the
// newer one writes them (then fields only the older has). Throws nothing: a recipe that does
// not parse compares as having no fields.
std::vector<RecipeChange> recipe_changes(const std::string& before_yaml, const std::string& after_yaml);

// "optimizer.lr 0.001 -> 0.002": one change, as the log and events.jsonl say it.
std::string describe_change(const RecipeChange& c);

// Copies RUN_DIR/STEM.EXT to the next free RUN_DIR/STEM.N.EXT and returns that file's name
// ("recipe.1.yaml"); empty when there is no STEM.EXT. Throws UserError when it cannot.
std::string keep_numbered_copy(const std::string& run_dir, const std::string& stem, const std::string& ext);
// The same with `text` as the new file's content (a recipe read from a checkpoint).
std::string keep_numbered_text(const std::string& run_dir, const std::string& stem, const std::string& ext,
                               const std::string& text);

// RUN_DIR/recipe.yaml's text, empty when there is none.
std::string stored_recipe_text(const std::string& run_dir);

// Whether RUN_DIR/metrics.jsonl shows the run's end at step `last`: its summary, or the final
// evaluation at `last` (a job that only finished the evaluation writes no summary).
bool run_has_ended(const std::string& run_dir, int64_t last);

}  // namespace runner
