// `runner plan RECIPE --search` (plan_search.h): the search (runner/plan/search.h), its table
// or JSON, and --write; and the search `parallel: auto` runs at plan and train start.
#include "runner/cli/plan_search.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "runner/errors.h"
#include "runner/plan/search.h"
#include "runner/run/verify.h"

namespace runner::cli {

namespace {

// Writes the winner's recipe to `out` and reads it back: the file must plan exactly the
// candidate. The user's text keeps relative input paths, which a file written elsewhere would
// read from its own directory: then the resolved recipe (absolute paths) is written instead.
std::string write_layout(const Recipe& r, const SearchCandidate& c, const std::string& out) {
  const auto save = [&](const std::string& text) {
    std::ofstream f(out, std::ios::binary);
    if (!(f << text)) throw UserError(SourceLoc{out}, "cannot write the recipe file", "check the directory exists and is writable");
  };
  save(write_candidate_yaml(r, c));
  try {
    if (recipe_to_yaml(load_recipe(out)) == recipe_to_yaml(c.recipe)) return "the recipe's own text, layout sections replaced";
  } catch (const UserError&) {
  }
  save(fmt::format("# Written by runner plan --search: {}; the recipe as resolved (absolute paths, every\n"
                   "# default filled in), as its own text read from here would not plan the same layout.\n",
                   c.describe()) +
       recipe_to_yaml(c.recipe));
  return "the resolved recipe: its own text's relative paths would not read the same files from there";
}

}  // namespace

int run_plan_search(const PlanSearchOptions& o) {
  const Recipe r = load_recipe(o.recipe_path, o.sets);
  SearchOptions so;
  so.world = o.world;
  so.top = o.top;
  so.profile = o.profile;
  SearchResult res = search_layouts(r, so);
  // --verify K (V): the top K run a few steps each, re-ranked by measured step (verify.h), so
  // --write writes the measured best.
  std::optional<VerifyReport> verified;
  if (o.verify > 0)
    verified = verify_layouts(res, {o.verify, o.verify_steps, std::filesystem::read_symlink("/proc/self/exe").string(),
                                    o.verify_dir});
  std::string wrote;
  if (!o.write.empty()) wrote = write_layout(r, res.candidates.front(), o.write);
  if (o.json) {
    nlohmann::json j = res.to_json();
    if (verified) add_verify_json(j, res, *verified);
    if (!o.write.empty()) j["search"]["written"] = o.write;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << res.table();
    if (verified) std::cout << verify_table(res, *verified);
    if (!o.write.empty()) std::cout << fmt::format("wrote {} (layout 1: {}; {})\n", o.write, res.candidates.front().describe(), wrote);
  }
  return 0;
}

Recipe searched_recipe(const Recipe& r, int64_t world, const std::string& world_from, std::string* note,
                       std::string* search_json) {
  SearchOptions so;
  so.world = world;
  so.top = 1;
  SearchResult res = search_layouts(r, so);
  if (world > 0) res.world_source = world_from;
  const SearchCandidate& best = res.candidates.front();
  if (note)
    *note = fmt::format("layout searched (parallel: auto): {} | best of {} that fit among {} searched on {} devices ({}), "
                        "predicted {:.4g} s per step, {:.2f} s to search",
                        best.describe(), res.feasible, res.searched, res.world, res.world_source, best.predicted.step_s,
                        res.seconds);
  if (search_json) *search_json = res.to_json().dump(2) + "\n";
  return best.recipe;
}

}  // namespace runner::cli
