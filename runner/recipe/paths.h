// The recipe's path fields and what a relative one is relative to.
//
// Design: a recipe names its inputs (data.path, data.val_path, model.init_from) beside itself, so a relative
// input is read from the recipe file's directory, whatever directory the command runs in; a
// path given with --set was typed in a shell, so it is relative to the working directory. The
// outputs (train.run_dir, checkpoint.dir) are relative to the working directory, like the
// default run directory runs/<name>. Every one of them is made absolute as the recipe is
// loaded, so the resolved recipe a run stores (RUN_DIR/recipe.yaml and every checkpoint) holds
// absolute paths, and `runner resume` or a Slurm job started in another directory finds the
// same files.
#pragma once
#include <string>

#include "runner/recipe/recipe.h"

namespace runner {

// Makes the path fields of `r` absolute: the inputs written in the recipe file against
// `recipe_file`'s directory, the outputs written there and every path given with --set
// against the working directory. With `recipe_file` empty (a recipe read from text, such as
// the one a run stored) only the --set paths change: the text's own stay as written.
void resolve_recipe_paths(Recipe& r, const std::string& recipe_file);

}  // namespace runner
