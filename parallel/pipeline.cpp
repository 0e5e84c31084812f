// Pipeline schedules (see pipeline.h).
#include "parallel/pipeline.h"

#include <algorithm>
#include <stdexcept>

namespace parallel {

std::vector<PipeAction> schedule_1f1b(int stage, int stages, int micros) {
  std::vector<PipeAction> s;
  int warmup = std::min(stages - stage - 1, micros);
  int f = 0, b = 0;
  for (; f < warmup; ++f) s.push_back({true, f});
  while (f < micros) {
    s.push_back({true, f++});
    s.push_back({false, b++});
  }
  while (b < micros) s.push_back({false, b++});
  return s;
}

std::vector<PipeAction> schedule_gpipe(int stage, int stages, int micros) {
  (void)stage;
  (void)stages;
  std::vector<PipeAction> s;
  for (int f = 0; f < micros; ++f) s.push_back({true, f});
  for (int b = 0; b < micros; ++b) s.push_back({false, b});
  return s;
}

std::vector<PipeAction> pipeline_schedule(const std::string& name, int stage, int stages, int micros) {
  if (name == "1f1b") return schedule_1f1b(stage, stages, micros);
  if (name == "gpipe") return schedule_gpipe(stage, stages, micros);
  throw std::invalid_argument("unknown pipeline schedule '" + name + "'");
}

int max_in_flight(const std::vector<PipeAction>& schedule) {
  int cur = 0, best = 0;
  for (auto& a : schedule) {
    cur += a.forward ? 1 : -1;
    best = std::max(best, cur);
  }
  return best;
}

}  // namespace parallel
