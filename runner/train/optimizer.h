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
// Sum of squares of elements [a, e) of `t` (fp32, or a 16-bit tensor widened in pieces), in
// double.
double sum_squares(ops::Backend& be, const ops::Tensor& t, int64_t a, int64_t e);

// Whether the run keeps fp32 master weights: the compute copy is 16-bit and
// precision.master_weights is fp32.
bool keeps_masters(const PrecisionConfig& p);
// The fp32 master weights of this rank (st.masters), shaped like its Adam moments (its ZeRO-1
// piece), from the initial fp32 values (init_param_values of each parameter's desc in
// `descs`, found by name), so that values == round(masters) from the start.
void init_masters(TrainState& st, const std::vector<ops::TensorDesc>& descs, const ModelConfig& m, uint64_t seed);

// Clipping factor min(1, clip / (norm + 1e-6)); 1 when clip <= 0.
double clip_factor(double norm, double clip);

// One AdamW update of every parameter (t = step + 1 for bias correction), gradients
// multiplied by grad_scale first (clipping and 1/loss scale). Allocates the moments on first
// use (optimizer account). With fp32 masters the update is applied to the masters and the
// compute copy is their rounding to nearest even; 16-bit values without masters (`same`) are
// widened, updated in fp32 and rounded back; 16-bit gradients are widened. Moments are fp32.
// With zero_grads, the gradient elements the update reads are zeroed in the same pass
// (Backend::adamw_update_zero_grad); zero_grads_rest then zeroes the others.
void adamw_step(ops::Backend& be, const OptimizerConfig& o, TrainState& st, double lr, double grad_scale,
                bool zero_grads = false);

// Every gradient := 0 (a step that updated nothing: an fp16 overflow, a non-finite step).
void zero_grads(ParamSet& ps);
// The gradient elements adamw_step(..., zero_grads = true) does not visit:
// outside each parameter's owned range (ZeRO-1 gives this rank a piece). After that step, every
// gradient is zero, as after zero_grads, with one pass over memory instead of two.
void zero_grads_rest(ops::Backend& be, ParamSet& ps);

}  // namespace runner
