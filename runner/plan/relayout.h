// Resuming on another layout: which numbers of the batch equation are derived again.
//
// A checkpoint stores its recipe as resolved, holding the dp and accum its layout derived. When
// a resume's overrides change the layout (any parallel.* field), carrying those two over would
// pin the old layout's split of the global batch; instead they are cleared, and make_plan
// derives them again for the new layout (resolve.cpp), keeping the global batch. The rule is
// the batch equation's, so it lives in plan/, beside it; the run directory's resume preparation
// (runner/run/run_dir.h) only calls it.
#pragma once
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"

namespace runner {

// `r`: a stored recipe with the user's --set overrides applied (Recipe::locs says which fields
// they gave). When the overrides change the layout, clears parallel.dp and batch.accum unless
// the overrides give them (the batch.* overrides give accum), so that make_plan derives them
// again. Returns what it cleared, as "dp (was 2)" / "accum (was 4)"; empty when nothing is.
std::vector<std::string> rederive_for_new_layout(Recipe& r);

}  // namespace runner
