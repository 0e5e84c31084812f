// AdamW with a learning-rate schedule and global-norm gradient clipping.
//
// The math lives in the backend (ops::Backend::adamw_update); this file owns the
// policy: which step's learning rate, the clipping factor, which tensors decay.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/backend.h"
#include "runner/recipe/recipe.h"
#include "runner/state.h"

namespace runner {

// Learning rate for optimizer update number `step` (0-based) of `total_steps`:
// linear warm-up to lr over warmup_steps, then cosine or linear decay to min_lr_ratio*lr
// at the last step, or constant.
double lr_at(const OptimizerConfig& o, int64_t step, int64_t total_steps);

// Global L2 norm of all gradients (double accumulation).
double grad_norm(ops::Backend& be, const ParamSet& ps);

// Clipping factor min(1, clip / (norm + 1e-6)); 1 when clip <= 0.
double clip_factor(double norm, double clip);

// One AdamW update of every parameter (t = step + 1 for bias correction), gradients
// multiplied by grad_scale first. Allocates the moments on first use (optimizer account).
void adamw_step(ops::Backend& be, const OptimizerConfig& o, TrainState& st, double lr, double grad_scale);

void zero_grads(ParamSet& ps);

// Shape of parameter i's Adam moments on this rank: the parameter's shape, or {n} for a ZeRO-1
// piece of n elements.
std::vector<int64_t> moment_shape(const ParamSet& ps, size_t i);

}  // namespace runner
