// The cost model (cost.h). [i27: C fills this in; skeleton stubs]
#include "runner/plan/cost.h"

namespace runner {

double StepCost::comm_exposed_s() const {
  double s = 0;
  for (const auto& [group, secs] : comm_exposed) s += secs;
  return s;
}
double StepCost::comm_share() const { return step_s > 0 ? comm_exposed_s() / step_s : 0; }
nlohmann::json StepCost::to_json() const { return {{"step_s", step_s}}; }

StepCost predict_step(const Plan&, const HardwareProfile&) { return {}; }
int threads_per_rank(const Plan&, const HardwareProfile&) { return 0; }

}  // namespace runner
