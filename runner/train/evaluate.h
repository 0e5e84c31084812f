// Evaluation on every layout: the held-out loss (a pipeline forward per batch) and, for the
// built-in addition task, exact-match accuracy of greedy completions.
#pragma once
#include <cstdint>
#include <memory>

#include "parallel/grid.h"
#include "runner/data/data.h"
#include "runner/observe/records.h"
#include "runner/plan/plan.h"
#include "runner/train/rank_model.h"

namespace runner {

// Collective over grid.world(): every rank runs the same passes (a stop request is acted on
// after evaluation on several ranks; one rank stops early). The result is complete on world
// rank 0 (the loss on every rank).
EvalResult evaluate(const Plan& plan, parallel::Grid& grid, RankModel& model, std::shared_ptr<const DataSource> val,
                    uint64_t data_seed);

}  // namespace runner
