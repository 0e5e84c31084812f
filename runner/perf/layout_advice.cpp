// The layout change the search would make (layout_advice.h).
#include "runner/perf/layout_advice.h"

#include <fmt/format.h>

#include "runner/errors.h"

namespace runner {

namespace {

// The layout fields the advice may change when the user wrote them (Recipe::locs keys).
bool layout_key(const std::string& k) {
  for (const char* p : {"parallel.dp", "parallel.tp", "parallel.pp", "parallel.schedule", "parallel.virtual_stages",
                        "parallel.zero", "parallel.sequence_parallel", "parallel.stage_layers", "batch.micro",
                        "batch.accum", "recompute"})
    if (k.rfind(p, 0) == 0) return true;
  return false;
}

// The plan's recompute as the search writes it: "none", "full", "auto", "selective:attention_core,mlp".
std::string recompute_words(const RecomputeConfig& rc) {
  std::string s = to_string(rc.mode);
  if (rc.mode != RecomputeMode::selective) return s;
  s += ":";
  for (size_t i = 0; i < rc.modules.size(); ++i) {
    if (i) s += ",";
    s += to_string(rc.modules[i]);
  }
  return s;
}

std::string schedule_of(const Plan& p) { return to_string(p.recipe.parallel.schedule); }

}  // namespace

Recipe advice_recipe(const Plan& plan) {
  Recipe r = plan.recipe;
  if (r.parallel.search) return r;  // searched: what the user wrote beside `auto` stays
  for (auto it = r.locs.begin(); it != r.locs.end();) it = layout_key(it->first) ? r.locs.erase(it) : std::next(it);
  const ParallelConfig fresh;
  r.parallel.dp = fresh.dp;
  r.parallel.tp = fresh.tp;
  r.parallel.pp = fresh.pp;
  r.parallel.schedule = fresh.schedule;
  r.parallel.virtual_stages = fresh.virtual_stages;
  r.parallel.zero = fresh.zero;
  r.parallel.sequence_parallel = fresh.sequence_parallel;
  r.parallel.stage_layers.clear();
  r.batch.micro = r.batch.accum = 0;
  r.recompute = RecomputeConfig{};
  // The run trains the same: its global batch is a constraint, wherever it came from.
  if (!r.locs.count("batch.global")) r.locs["batch.global"] = r.loc("batch");
  r.batch.global = plan.global;
  return r;
}

bool same_layout(const Plan& p, const SearchCandidate& c) {
  return c.dp == p.dp && c.tp == p.tp && c.pp == p.pp && c.micro == p.micro && c.accum == p.accum &&
         c.virtual_stages == p.chunks && c.zero == p.recipe.parallel.zero &&
         c.sequence_parallel == p.recipe.parallel.sequence_parallel &&
         (p.pp == 1 || c.schedule == schedule_of(p)) && c.recompute == recompute_words(p.recipe.recompute);
}

std::string layout_change(const Plan& p, const SearchCandidate& c) {
  std::vector<std::string> parts;
  auto num = [&](const char* key, int64_t from, int64_t to) {
    if (from != to) parts.push_back(fmt::format("{}: {} -> {}", key, from, to));
  };
  auto word = [&](const char* key, const std::string& from, const std::string& to) {
    if (from != to) parts.push_back(fmt::format("{}: {} -> {}", key, from, to));
  };
  num("parallel.tp", p.tp, c.tp);
  num("parallel.pp", p.pp, c.pp);
  num("parallel.dp", p.dp, c.dp);
  num("parallel.virtual_stages", p.chunks, c.virtual_stages);
  if (p.pp > 1 || c.pp > 1) word("parallel.schedule", schedule_of(p), c.schedule);
  num("parallel.zero", p.recipe.parallel.zero, c.zero);
  word("parallel.sequence_parallel", p.recipe.parallel.sequence_parallel ? "true" : "false",
       c.sequence_parallel ? "true" : "false");
  num("batch.micro", p.micro, c.micro);
  num("batch.accum", p.accum, c.accum);
  word("recompute", recompute_words(p.recipe.recompute), c.recompute);
  std::string s;
  for (const std::string& x : parts) {
    if (!s.empty()) s += ", ";
    s += x;
  }
  return s;
}

std::string layout_advice(const Plan& p, const SearchResult& res, double measured_share, double predicted_step_s) {
  const SearchCandidate* best = nullptr;
  bool current_first = false;
  for (const SearchCandidate& c : res.candidates) {
    if (same_layout(p, c)) {
      current_first = best == nullptr;
      continue;
    }
    if (!best) best = &c;
  }
  if (!best) return "";
  std::string s = fmt::format("{}: predicted comm share {:.0f}% (now {:.0f}%), predicted step {:.3g} s", layout_change(p, *best),
                              100 * best->predicted.comm_share(), 100 * measured_share, best->predicted.step_s);
  if (predicted_step_s > 0) s += fmt::format(" (this layout's {:.3g} s)", predicted_step_s);
  if (current_first) s += "; the search ranks this layout first, so the communication is the machine's more than the layout's";
  return s;
}

std::string search_layout_advice(const Plan& plan, double measured_share, double predicted_step_s, const std::string& profile_file) {
  SearchOptions so;
  so.world = plan.world;
  so.top = 5;
  so.profile = profile_file;
  so.threads = 1;  // the training ranks own the cores; the search waits its turn on one
  try {
    return layout_advice(plan, search_layouts(advice_recipe(plan), so), measured_share, predicted_step_s);
  } catch (const std::exception& e) {  // a running job never stops for its advice
    return fmt::format("the layout search found nothing to suggest: {}", e.what());
  }
}

}  // namespace runner
