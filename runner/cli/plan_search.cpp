// `runner plan --search` (plan_search.h). [i27: S fills this in; skeleton stub]
#include "runner/cli/plan_search.h"

#include <iostream>

#include "runner/plan/search.h"
#include "runner/recipe/recipe.h"

namespace runner::cli {

int run_plan_search(const PlanSearchOptions& o) {
  const Recipe r = load_recipe(o.recipe_path, o.sets);
  SearchOptions so;
  so.world = o.world;
  so.top = o.top;
  so.profile = o.profile;
  SearchResult res = search_layouts(r, so);
  std::cout << (o.json ? res.to_json().dump(2) + "\n" : res.table());
  return 0;
}

}  // namespace runner::cli
