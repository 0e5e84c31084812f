// The layout search (search.h). [i27: S fills this in; skeleton stubs]
#include "runner/plan/search.h"

namespace runner {

nlohmann::json SearchCandidate::to_json() const { return nlohmann::json::object(); }
nlohmann::json SearchResult::to_json() const { return {{"search", nlohmann::json::object()}}; }
std::string SearchResult::table() const { return ""; }

SearchResult search_layouts(const Recipe&, const SearchOptions&) {
  throw UserError({}, "plan --search is not built yet", "wait for issue 27");
}
std::string write_candidate_yaml(const Recipe& r, const SearchCandidate&) { return r.source_text; }

}  // namespace runner
