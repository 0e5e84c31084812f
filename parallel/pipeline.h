// Pipeline schedules: the order of forward and backward micro-batch passes on one stage.
//
// GPipe (Huang et al. 2019): all forwards, then all backwards; every micro-batch's
// activations are alive at once. 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs
// min(p-s-1, m) warm-up forwards, then alternates one forward and one backward, then drains
// the backwards; at most min(p-s, m) micro-batches are in flight. Both have the bubble
// (p-1)/(m+p-1) of the ideal step time.
#pragma once
#include <string>
#include <vector>

namespace parallel {

struct PipeAction {
  bool forward = true;
  int micro = 0;
};

std::vector<PipeAction> schedule_1f1b(int stage, int stages, int micros);
std::vector<PipeAction> schedule_gpipe(int stage, int stages, int micros);
// By name ("1f1b" | "gpipe"); throws std::invalid_argument otherwise.
std::vector<PipeAction> pipeline_schedule(const std::string& name, int stage, int stages, int micros);
// The most micro-batches whose activations a stage holds at once under `schedule`.
int max_in_flight(const std::vector<PipeAction>& schedule);

}  // namespace parallel
