// A trained model on one rank, for using it: `runner generate` and `runner export`.
//
// load_trained_model reads a run directory (its LATEST checkpoint, falling back to the newest
// that verifies) or one checkpoint file, takes the recipe stored in it, and lays the model out
// on one rank in fp32 (tp = pp = dp = 1, no recompute): the plan and its ModelLayout come from
// make_plan as for training, the values are the checkpoint's logical tensors (the fp32 masters
// of a 16-bit run). Whatever layout trained it, the logical tensors are the same, so every
// layout's checkpoint loads here. Nothing below builds a second model: logits come from the
// model builder's graph run by the executor, as in training.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runner/model/model.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace runner {

struct TrainedModel {
  std::string checkpoint;  // the file loaded
  int64_t step = 0;
  Plan plan;               // the one-rank fp32 plan of the stored recipe
  TrainState logical;      // the logical tensors (checkpoint shapes, fp32), no moments
  ParamSet params;         // the same values in the one-rank graph's shapes (vocabulary padding zero)
  const ModelConfig& model() const { return plan.recipe.model; }
  // The logical tensor `name` (a parameter of the layout's table).
  const ops::Tensor& logical_tensor(const std::string& name) const;
};

// Throws UserError (not a run directory or checkpoint, none verifies).
// `overrides` (`--set key=value`) change fields of the stored recipe (e.g. inference.batch).
TrainedModel load_trained_model(const std::string& run_dir_or_checkpoint, const std::vector<std::string>& overrides = {});

// A full forward pass over B sequences of T tokens (row-major, B*T ids), through the model
// builder's graph for that (B, T) and the executor: logits (B*T, vocab) in fp32, the real
// vocabulary only.
std::vector<float> full_forward_logits(TrainedModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T);

}  // namespace runner
