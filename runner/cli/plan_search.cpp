// `runner plan --search` (plan_search.h). [i27: S fills this in; skeleton stub]
#include "runner/cli/plan_search.h"

#include <filesystem>
#include <iostream>

#include "runner/plan/search.h"
#include "runner/recipe/recipe.h"
#include "runner/run/verify.h"

namespace runner::cli {

int run_plan_search(const PlanSearchOptions& o) {
  const Recipe r = load_recipe(o.recipe_path, o.sets);
  SearchOptions so;
  so.world = o.world;
  so.top = o.top;
  so.profile = o.profile;
  SearchResult res = search_layouts(r, so);
  // --verify K: the top K run a few steps each and are re-ranked by measured step (verify.h).
  if (o.verify > 0) {
    VerifyOptions vo;
    vo.k = o.verify;
    vo.steps = o.verify_steps;
    vo.runner = std::filesystem::read_symlink("/proc/self/exe").string();
    vo.work_dir = o.verify_dir;
    const VerifyReport rep = verify_layouts(res, vo);
    nlohmann::json j = res.to_json();
    add_verify_json(j, res, rep);
    std::cout << (o.json ? j.dump(2) + "\n" : res.table() + verify_table(res, rep));
    return 0;
  }
  std::cout << (o.json ? res.to_json().dump(2) + "\n" : res.table());
  return 0;
}

}  // namespace runner::cli
