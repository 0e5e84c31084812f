// The numerics of 16-bit training that live outside the operators: the fp16 loss scaler, and
// the per-tensor gradient range report (what the scaler's single scale means for each tensor).
//
// Loss scaling (precision.loss_scale, fp16 compute only): the backward is seeded with
// scale / tokens instead of 1 / tokens, so every gradient is `scale` times larger and small
// gradients survive fp16's smallest subnormal (2^-24); the optimizer divides it out (it is part
// of adamw_step's grad_scale). A step whose gradients hold inf or nan is skipped (no update,
// no moment change); `dynamic` then multiplies the scale by backoff_factor (never below
// min_scale), and after growth_interval clean steps in a row by growth_factor. `static` keeps
// `init`; `none` uses 1. Either way, more than max_consecutive_skips overflowed steps in a row
// stop the run (kExitNumerics). bf16 and fp32 have fp32's exponent range: no scaling.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "parallel/grid.h"
#include "runner/model/layout.h"
#include "runner/recipe/recipe.h"
#include "runner/observe/records.h"
#include "runner/state.h"

namespace runner {

class RankModel;

class LossScaler {
 public:
  explicit LossScaler(const PrecisionConfig& p);
  // Whether gradients are scaled and overflowed steps skipped (fp16 with dynamic or static).
  bool active() const { return active_; }
  // The scale a fresh run starts with (1 when inactive).
  double initial() const { return active_ ? cfg_.init : 1.0; }
  // After a step's gradients are known to be finite (true) or not: updates `s` and returns
  // whether the step's update is applied.
  bool update(LossScalerState& s, bool finite) const;
  // More overflowed steps in a row than the recipe allows.
  bool exhausted(const LossScalerState& s) const { return s.consecutive_skips > cfg_.max_consecutive_skips; }
  const LossScaleConfig& config() const { return cfg_; }

 private:
  LossScaleConfig cfg_;
  bool active_;
  bool dynamic_;
};

// fp16's limits, for the report.
inline constexpr double kF16Max = 65504.0;
inline constexpr double kF16MinSubnormal = 5.9604644775390625e-08;  // 2^-24

// Collective over grid.world(): the report for the gradients the step left in `ps` (scaled by
// `scale`). Must follow RankModel::finish_grads.
GradReport grad_report(ops::Backend& be, const RankModel& model, const ParamSet& ps, const ModelLayout& layout,
                       parallel::Grid& grid, double scale);

}  // namespace runner
