// A trained model on one rank, for using it: `runner generate` and `runner export`.
//
// load_trained_model reads a run directory (its LATEST checkpoint, falling back to the newest
// that verifies) or one checkpoint file, takes the recipe stored in it, and lays the model out
// in fp32 (no recompute) on one rank (tp = pp = dp = 1), or under mpirun on the recipe's
// tensor-parallel layout over the world (each rank its shards): the plan and its ModelLayout come from
// make_plan as for training, the values are the checkpoint's logical tensors (the fp32 masters
// of a 16-bit run). Whatever layout trained it, the logical tensors are the same, so every
// layout's checkpoint loads here. Nothing below builds a second model: logits come from the
// model builder's graph run by the executor, as in training.
//
// The model runs on the device the stored recipe names (hardware.device, after --set; chosen
// once by runner/device/ select_backend, as `runner train` does): its weights live in that
// device's memory and host code reaches them only through named crossings (docs/invariants.md,
// invariant 7): the checkpoint's tensors are read into host memory and copied in once per
// parameter; generation's logits come out row by row (logits_rows_to_host); export stages each
// weight out (logical_tensor). On the CPU every crossing is a plain copy of the same bits.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/executor.h"
#include "parallel/grid.h"
#include "runner/model/gpt.h"
#include "runner/model/layout.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace runner {

struct TrainedModel {
  std::string checkpoint;  // the file loaded
  // The run's tokenizer files (RUN_DIR/tokenizer/ of the run directory the checkpoint belongs
  // to; tok::load_tokenizer reads them); "" when there are none: the ids are bytes.
  std::string tokenizer_dir;
  // The backend its graphs run on, chosen by the command that loaded it (runner/device/).
  ops::Backend* backend = nullptr;
  int64_t step = 0;
  Plan plan;               // the one-rank fp32 plan of the stored recipe
  // The checkpoint's values in this rank's graph's shapes (vocabulary padding zero), in the
  // backend's memory (its device's), in ModelLayout::stage_params order.
  ParamSet params;
  // Under mpirun (several ranks): the grid of the recipe's tensor-parallel layout (dp = world /
  // tp replicas); null on one process. This rank holds tensor-parallel shard tp_rank of
  // pipeline stage `stage`.
  std::shared_ptr<parallel::Grid> grid;
  int64_t tp_rank = 0;
  int stage = 0;
  const ModelConfig& model() const { return plan.recipe.model; }
  // This rank's graph spec (its pipeline stage, its tensor-parallel shard); set B, T, decode.
  GptSpec spec() const { return plan.layout->spec(stage, tp_rank); }
  // Binds this rank's parameters to an executor of a graph from spec(), and the
  // tensor-parallel group when tp > 1.
  void bind(ops::Executor& ex, const ops::Graph& g);
  // The logits over the whole padded vocabulary from this rank's graph's logits: `L` itself on
  // one tensor-parallel rank; under tp the vocabulary shards gathered over the tp group (every
  // tp rank gets the same bits). Valid until the next call.
  const ops::Tensor& full_vocab(const ops::Tensor& L);
  ops::Tensor gathered;  // full_vocab's buffer under tp
  // Runs executor `ex` of graph `g` (built from spec()) over B*T tokens and returns the whole
  // vocabulary's logits (B*T, padded vocabulary), the same bits on every rank: one stage, its
  // forward_logits through full_vocab; under pp every stage receives its input activation from
  // the previous stage and sends its output to the next (world send/recv, as the training
  // pipeline does), and the last stage's logits are broadcast over the pp group. Valid until
  // the next call.
  const ops::Tensor& logits(ops::Executor& ex, const ops::Graph& g, const int32_t* tokens);
  ops::Tensor pp_logits;  // logits()'s buffer under pp
  // The logical tensor `name` (a parameter of the layout's table) staged out of the device into
  // host memory: the checkpoint's values, bit for bit. One rank holding the whole model only
  // (tp = pp = 1, as `runner export` loads it).
  ops::Tensor logical_tensor(const std::string& name) const;
  // The parameters' names in checkpoint order (the logical tensors logical_tensor stages out).
  const std::vector<std::string>& logical_names() const { return params.names; }
};

// The named crossing of generation's logits: rows `rows` of `L` (rows x padded vocabulary,
// fp32, in the backend's memory), their first `V` columns, copied out into host memory
// (rows.size() x V, row-major) and waited for. Only the rows a token is chosen from cross.
std::vector<float> logits_rows_to_host(const ops::Tensor& L, const std::vector<int64_t>& rows, int64_t V);

// Throws UserError (not a run directory or checkpoint, none verifies, a GPU device kind on a
// machine without one: the stored recipe's hardware.device chooses the backend, as train's
// does; --set hardware.device=cpu runs it on the CPU) before anything is allocated.
// `overrides` (`--set key=value`) change fields of the stored recipe (e.g. inference.batch).
// `world` (mpirun, several ranks): lay the model out as the recipe's tensor-parallel layout over
// them (make_plan with the world size, as training does; sequence parallelism off, dp = world
// / tp replicas, the recipe's pipeline stages). Null or one rank: one rank.
TrainedModel load_trained_model(const std::string& run_dir_or_checkpoint, const std::vector<std::string>& overrides = {},
                                std::unique_ptr<parallel::Communicator> world = nullptr);

// The model builder's graph for B sequences of T tokens, bound to `m`'s weights, and its
// executor: one full forward pass per logits() call (the --no-kv-cache path, and
// full_forward_logits below).
struct FullForward {
  FullForward(TrainedModel& m, int64_t B, int64_t T);
  // Logits (B*T, padded vocabulary) of B*T token ids, row-major.
  const ops::Tensor& logits(const int32_t* tokens) { return model.logits(ex, graph, tokens); }
  TrainedModel& model;
  ops::Graph graph;
  ops::Executor ex;
};

// A full forward pass over B sequences of T tokens (row-major, B*T ids), through the model
// builder's graph for that (B, T) and the executor: logits (B*T, vocab) in fp32, the real
// vocabulary only.
std::vector<float> full_forward_logits(TrainedModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T);

}  // namespace runner
