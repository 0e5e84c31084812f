// Everything needed to continue training bit for bit: what a checkpoint holds.
//
// All randomness in the runner is counter-based (ops/rng.h): parameter initialisation is a
// function of (init_seed, name, element), dropout of (dropout_seed, step, site, element),
// data order of (data_seed, epoch, index). So "every RNG state" is a handful of integers,
// stored per rank all the same so that a future stateful generator has its place.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/tensor.h"
#include "runner/data/data.h"
#include "runner/model/gpt.h"

namespace runner {

struct RngState {
  uint64_t init_seed = 0;     // parameter initialisation
  uint64_t dropout_seed = 0;  // dropout masks: key = rng_key(dropout_seed, step, ...)
  uint64_t data_seed = 0;     // data shuffling
  uint64_t sample_seed = 0;   // host-side sampling (ops::SplitMix key)
  uint64_t sample_counter = 0;
};

struct LossScalerState {
  double scale = 1.0;          // 1 for fp32/bf16
  int64_t good_steps = 0;      // consecutive finite steps since the last change
  int64_t skipped_steps = 0;   // total overflowed steps skipped
  // Overflowed steps in a row (precision.loss_scale.max_consecutive_skips). Not in the
  // checkpoint's /state (its fields and checksum are fixed by format version 1): after a resume
  // the count restarts at 0. The numbers are unaffected; only where the limit stops a run that
  // overflows on every step can move later by the skips before the checkpoint.
  int64_t consecutive_skips = 0;
};

struct TrainState {
  int64_t step = 0;            // optimizer steps completed
  int64_t tokens = 0;          // training tokens consumed
  ParamSet params;             // values (parameters account) and grads (gradients account)
  std::vector<ops::Tensor> adam_m, adam_v;  // one per parameter, fp32, optimizer account
  // fp32 master weights when the compute copy (params.values) is 16-bit and the recipe keeps
  // masters (precision.master_weights: fp32): shaped like adam_m (this rank's ZeRO-1 piece),
  // optimizer account; empty otherwise. Invariant: values == round_to_compute(masters) on the
  // owned range, so a checkpoint stores the masters (as /params) and the compute copy follows.
  std::vector<ops::Tensor> masters;
  LoaderState loader;          // the train loader's cursor at the step boundary
  RngState rng;
  LossScalerState scaler;
  double loss_ema = 0;         // running mean of the loss (spike detection)
  std::string recipe_yaml;     // the resolved recipe
  // Per rank (world rank order); a single-rank run has one entry.
  int world_rank = 0, world_size = 1;
  // OpenMP threads per rank of this run (recorded in checkpoints, for the record: results do
  // not depend on it).
  int64_t omp_threads = 0;

  // The step-boundary scalars (step, tokens, loader cursor, RNG, loss scaler, loss mean), not
  // the tensors, the recipe or the rank.
  void copy_scalars_from(const TrainState& o) {
    step = o.step;
    tokens = o.tokens;
    loader = o.loader;
    rng = o.rng;
    scaler = o.scaler;
    loss_ema = o.loss_ema;
    omp_threads = o.omp_threads;
  }
};

// Shape of parameter i's Adam moments (and fp32 masters) on this rank: the parameter's shape, or
// {n} for a ZeRO-1 piece of n elements. Beside the state it shapes, so the optimizer that
// allocates the moments and the checkpoint that loads them both stand on it.
inline std::vector<int64_t> moment_shape(const ParamSet& ps, size_t i) {
  auto [a, e] = ps.owned_range(i);
  if (a == 0 && e == ps.values[i].numel()) return ps.values[i].shape();
  return {e - a};
}

}  // namespace runner
