// The cost model: a plan's predicted step time on a hardware profile (runner/perf/hardware_profile.h).
//
// Per operator from the plan's own graphs (the layout's per-stage graphs, as the ledger reads
// them): GEMMs from the calibrated throughput for their shape, memory-bound operators from
// their bytes and the measured bandwidth, attention from its measured rate; the backward's
// GEMMs (dX and dW) likewise; recompute's extra forward for the nodes the plan recomputes;
// tensor-parallel collectives per layer priced at the level they cross (inside a node or across
// nodes); the data-parallel all-reduce (reduce-scatter + all-gather under ZeRO-1) per bucket,
// overlapped with the backward as the runner overlaps it; pipeline sends and the bubble of the
// plan's schedule; the optimizer step; the data loader. docs/search.md has the formulas.
// The API below is shared by the search and the monitor: change it together with them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/perf/hardware_profile.h"
#include "runner/plan/plan.h"

namespace runner {

// Seconds per optimizer step on the critical path (the slowest pipeline stage's rank), and
// what makes them up: step_s = compute + recompute + exposed communication + bubble +
// optimizer + data (each field is its share of step_s, so they sum to it).
struct StepCost {
  double step_s = 0;
  double tokens_per_s = 0;        // global tokens per step / step_s
  double mfu = 0;                 // model FLOPs (6N + attention, no recompute) per device / peak
  double tflops_per_device = 0;   // achieved model TFLOP/s per device
  // The breakdown, seconds per step.
  double compute = 0;             // forward + backward of every micro-batch on the critical stage
  double recompute = 0;           // recompute's extra forward
  double bubble = 0;              // pipeline fill and drain (the schedule's idle time)
  double optimizer = 0;           // AdamW over this rank's parameters (+ ZeRO's gather)
  double data = 0;                // batch loading not hidden by the prefetching loader
  // Communication by group, total and exposed (not hidden behind compute): "tp", "dp", "pp".
  std::map<std::string, double> comm_total, comm_exposed;
  double comm_exposed_s() const;  // sum of comm_exposed
  double comm_share() const;      // comm_exposed_s() / step_s
  int threads = 0;                // CPU: threads per rank the prediction assumed
  nlohmann::json to_json() const; // the fields above; the JSON of search.candidates[].predicted
};

// The plan's predicted step on `hw`. The plan must be the full make_plan result (its layout).
StepCost predict_step(const Plan& p, const HardwareProfile& hw);

// Per transformer layer (model.n_layers entries) of the plan's layout, one micro-batch: its
// nodes' forward + backward seconds with their tensor-parallel collectives (`pass`) and the
// recompute's extra forward (`recompute`), priced as predict_step prices them: the critical
// stage's per-micro-batch f + b is at least its layers' sum. The search's bound reads it.
struct LayerSeconds {
  double pass = 0, recompute = 0;
};
std::vector<LayerSeconds> layer_seconds(const Plan& p, const HardwareProfile& hw);

// Threads per rank a run of the plan gets on `hw` (CPU: train.threads, else the node's cores
// shared by its ranks, as runner/train/startup.cpp shares them; GPU: 0).
int threads_per_rank(const Plan& p, const HardwareProfile& hw);

}  // namespace runner
