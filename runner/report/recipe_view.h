// What the report shows of a run's resolved recipe: recipe.yaml holds every field with its
// default filled in, including those the run never reads (data.digits for HDF5 data, the loss
// scale of an fp32 run); the report leaves those out and says which, so the page reads as the
// run's own settings. It also says from the recipe whether the run scaled its loss.
//
// Design: the report room stands on nothing of runner/ (tests/layering/rooms.py), so this reads
// recipe.yaml as YAML (yaml-cpp) for the few values the rules need and filters the text line by
// line, keeping the file's own order, quoting and comments.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace runner::report {

struct RecipeView {
  std::string text;                    // recipe.yaml without the fields that do not apply
  std::vector<std::string> left_out;   // "data.digits (data.kind is text)", ...
  std::optional<bool> loss_scaling;    // fp16 compute with loss_scale.mode dynamic or static; unset: unreadable recipe
};

RecipeView recipe_view(const std::string& recipe_yaml);

}  // namespace runner::report
