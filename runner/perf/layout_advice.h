// The layout change the search would make for a running job whose exposed communication is past
// the rule of thumb (30% of the step): the monitor's "communication" alert names it, so the user
// reads "parallel.tp: 2 -> 1, parallel.dp: 1 -> 2: predicted comm share 4% (now 38%)" rather
// than a list of things to try. The search (runner/perf/search.h) runs at the run's world with
// the recipe's constraints; a layout the user wrote by hand is what the alert questions, so its
// fields are searched again (the global batch stays: the run trains the same), while the fields
// written beside `parallel: auto` stay constraints.
#pragma once
#include <string>

#include "runner/perf/search.h"
#include "runner/plan/plan.h"

namespace runner {

// The recipe the advice searches: the plan's, its layout fields freed unless it was searched
// (parallel: auto), the global batch fixed at the plan's.
Recipe advice_recipe(const Plan& plan);
// Whether `c` is the plan's own layout.
bool same_layout(const Plan& plan, const SearchCandidate& c);
// What changes from the plan's layout to `c`: "parallel.tp: 2 -> 1, parallel.dp: 1 -> 2".
std::string layout_change(const Plan& plan, const SearchCandidate& c);
// The advice from a search result (best first): the best layout other than the plan's, its change,
// predicted communication share against the measured one and predicted step against the plan's.
// Empty when the result has no other layout.
std::string layout_advice(const Plan& plan, const SearchResult& res, double measured_share, double predicted_step_s);
// Runs the search (world = plan.world, the profile of `profile_file` or the recipe's) and returns
// layout_advice; on a search error, its message.
std::string search_layout_advice(const Plan& plan, double measured_share, double predicted_step_s,
                                 const std::string& profile_file = "");

}  // namespace runner
