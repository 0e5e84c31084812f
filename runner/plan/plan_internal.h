// Shared by the plan's parts: resolution (resolve.cpp), the memory ledger (ledger.cpp), the
// suggestions (suggest.cpp) and the reports (report.cpp). Not for other rooms: they read Plan.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/tensor.h"
#include "runner/plan/plan.h"

namespace runner::plan_detail {

ops::DType dtype_of(const std::string& name);
std::string or_list(const std::vector<int64_t>& v);  // "1, 2 or 3"
// Divisors of n near x, for "nearest valid choices".
std::vector<int64_t> nearest_divisors(int64_t n, int64_t x, int count = 2);

// Resolution (resolve.cpp), in this order: the grid (dp from the world size or the
// hardware), then the batch equation and the layout rules (divisibility, stage split,
// schedule), whose independent problems are thrown together as one UserError; resolve_grid and
// resolve_and_check are declared in plan.h.
void resolve_batch(const Recipe& r, Plan& p);

// The per-rank memory ledger from the layout's graphs (ledger.cpp), and inference sizing.
void compute_ledger(const Recipe& r, Plan& p);
void plan_inference(const Recipe& r, Plan& p);

// recompute.mode auto (recompute.cpp): chooses per-layer recompute sets for `whole` (the
// whole model's spec, nothing recomputed) until every stage fits p.device_memory, and
// records the choice in p.recompute_auto. Needs p's grid, batch and stage split resolved.
void choose_recompute(const Recipe& r, Plan& p, GptSpec& whole);
// Forward FLOPs of one node of `g`, from its tensors' shapes (this rank's shard).
double node_flops(const ops::Graph& g, const ops::Node& n);

// What would fit (suggest.cpp): candidates re-planned with make_plan(.., false).
void suggest(const Recipe& r, Plan& p);

}  // namespace runner::plan_detail
