// What would fit: a small search over the knobs a user can turn (ZeRO-1, recompute,
// micro-batch, tp, pp), each candidate verified by planning it. Candidates that change fewer
// knobs come first, then the smaller footprint. Each states the batch equation it implies
// (the global batch is kept, so a smaller micro-batch or another dp moves accum: "batch.micro:
// 2 -> global 64 = micro 2 x dp 1 x accum 32, ..."), so that the user sees what the step becomes.
#include <algorithm>

#include <fmt/format.h>

#include "runner/plan/plan_internal.h"

namespace runner::plan_detail {

void suggest(const Recipe& r, Plan& p) {
  struct Found { int changes; double total; std::string what; };
  std::vector<Found> found;
  const int64_t world = p.world;
  std::vector<int64_t> micros;
  for (int64_t m = p.micro; m >= 1; m /= 2) micros.push_back(m);
  for (int64_t tp : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
    if (tp < p.tp || tp > std::max<int64_t>(r.hardware.devices_per_node, p.tp)) continue;
    for (int64_t pp : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
      if (pp < p.pp || world % (tp * pp) != 0 || r.model.n_layers % pp != 0) continue;
      int64_t dp = world / (tp * pp);
      if (p.global % dp != 0) continue;
      for (int zero : {0, 1}) {
        if (zero < r.parallel.zero || (zero == 1 && dp == 1 && r.parallel.zero == 0)) continue;
        for (const char* rc : {"keep", "selective", "full"}) {
          std::string mode = rc;
          if (mode != "keep" && mode == to_string(r.recompute.mode)) continue;
          for (int64_t m : micros) {
            if ((p.global / dp) % m != 0) continue;
            Recipe c = r;
            std::vector<std::string> what;
            if (tp != p.tp) { c.parallel.tp = tp; what.push_back(fmt::format("parallel.tp: {}", tp)); }
            if (pp != p.pp) {
              c.parallel.pp = pp;
              c.parallel.stage_layers.clear();
              what.push_back(fmt::format("parallel.pp: {}", pp));
            }
            c.parallel.dp = dp;
            if (zero != r.parallel.zero) { c.parallel.zero = zero; what.push_back("parallel.zero: 1"); }
            if (mode != "keep") {
              c.recompute.mode = *parse_enum<RecomputeMode>(mode);
              c.recompute.layers.clear();
              if (mode == "selective") c.recompute.modules = {RecomputeModule::attention_core};
              what.push_back(mode == "full" ? "recompute: {mode: full}"
                                            : "recompute: {mode: selective, modules: [attention_core]}");
            }
            if (m != p.micro) what.push_back(fmt::format("batch.micro: {}", m));
            c.batch = {p.global, m, 0};
            if (what.empty()) continue;
            try {
              Plan q = make_plan(c, world, false);
              if (!q.fits) continue;
              std::string w;
              for (size_t i = 0; i < what.size(); ++i) w += (i ? ", " : "") + what[i];
              if (dp != p.dp) w += fmt::format(" (dp becomes {})", dp);
              w += fmt::format(" -> global {} = micro {} x dp {} x accum {}", q.global, q.micro, q.dp, q.accum);
              found.push_back({static_cast<int>(what.size()), q.worst_stage().total(), w});
              break;  // the largest micro-batch that fits for this combination
            } catch (const UserError&) {
            }
          }
        }
      }
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.changes != b.changes ? a.changes < b.changes : a.total < b.total;
  });
  for (size_t i = 0; i < found.size() && i < 4; ++i)
    p.suggestions.push_back(fmt::format("{}, {} per rank", found[i].what, format_bytes(found[i].total)));
  if (p.suggestions.empty())
    p.suggestions.push_back(
        fmt::format("more devices: nothing on {} devices fits (tried tp, pp, ZeRO-1, recompute, micro)", world));
}

}  // namespace runner::plan_detail
