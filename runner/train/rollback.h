// The in-memory tier of recovery: a copy of the training state in host memory every
// checkpoint.snapshot_every steps; a step with a non-finite loss, or a loss above
// checkpoint.spike_threshold x its running mean, rolls back to that copy and the offending
// batch is skipped when its step comes round again, without touching disk. The tier keeps
// its own time (snapshots taken, attempts lost, restores), which the loop reports with the
// next step record as the breakdown's rollback part.
#pragma once
#include <cstdint>
#include <memory>
#include <set>

#include "runner/checkpoint/checkpoint.h"
#include "runner/data/data.h"
#include "runner/observe/metrics.h"
#include "runner/observe/records.h"
#include "runner/recipe/recipe.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}

namespace runner {

class Rollback {
 public:
  Rollback(const CheckpointConfig& cfg, DataLoader& loader, RunMetrics& metrics, std::shared_ptr<spdlog::logger> log)
      : cfg_(cfg), loader_(loader), metrics_(metrics), log_(std::move(log)) {}

  // Before a step: a snapshot when the cadence says so and there is none of this step yet.
  void before_step(const TrainState& st);
  // After a step (st.step already advanced): updates the loss's running mean; on a bad or
  // spiking loss with a snapshot to go back to, restores it into `st` and the loader, marks
  // the batch to skip, records the rollback and returns true (the attempt's total_ms is lost).
  bool after_step(const StepResult& s, TrainState& st);
  // Whether step `step`'s batch (0-based: the steps completed before it) is to be skipped;
  // true once per rollback, with a warning.
  bool skip_batch(int64_t step);
  // The tier's time since the last call, for the next step record.
  double take_ms() {
    const double ms = ms_;
    ms_ = 0;
    return ms;
  }

 private:
  const CheckpointConfig& cfg_;
  DataLoader& loader_;
  RunMetrics& metrics_;
  std::shared_ptr<spdlog::logger> log_;
  MemorySnapshot snapshot_;
  std::set<int64_t> skip_;  // steps whose batch is skipped after a rollback
  double ms_ = 0;
};

}  // namespace runner
