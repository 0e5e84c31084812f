#include "runner/generate/trained_model.h"

#include <filesystem>

#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/policy.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

const ops::Tensor& TrainedModel::logical_tensor(const std::string& name) const {
  const int i = logical.params.index(name);
  RUNNER_CHECK(i >= 0, "parameter " + name + " missing from the loaded model");
  return logical.params.values[static_cast<size_t>(i)];
}

TrainedModel load_trained_model(const std::string& src, const std::vector<std::string>& overrides,
                                std::unique_ptr<parallel::Communicator> world) {
  TrainedModel tm;
  Recipe recipe;
  if (fs::is_directory(src)) {
    ResumeRequest req = prepare_resume(src, overrides, -1, /*strict=*/false);
    recipe = std::move(req.recipe);
    tm.checkpoint = req.point.path;
  } else if (fs::is_regular_file(src)) {
    verify_checkpoint_file(src);
    recipe = load_recipe_text(read_recipe_text(src), src, overrides);
    tm.checkpoint = src;
  } else {
    throw UserError({src, 0, 0}, "no such run directory or checkpoint file",
                    "pass the directory `runner train` wrote (runs/NAME) or one of its checkpoints/step_N.h5");
  }
  // fp32, nothing recomputed; the batch is one sequence (generation builds its own graphs). One
  // process: one rank. Several: the recipe's tensor-parallel layout, each dp replica the same.
  const int64_t ranks = world ? world->size() : 1;
  const int64_t tp = recipe.parallel.tp;
  if (ranks > 1 && recipe.parallel.pp > 1)
    throw UserError({tm.checkpoint, 0, 0},
                    fmt::format("generation over pipeline stages is not implemented (the recipe has pp {})", recipe.parallel.pp),
                    "run runner generate without mpirun: a checkpoint of any layout loads into one rank");
  if (ranks > 1 && ranks % tp != 0)
    throw UserError({tm.checkpoint, 0, 0}, fmt::format("{} ranks are not a multiple of the recipe's tp {}", ranks, tp),
                    fmt::format("start a multiple of {} ranks (each group of tp ranks generates the same)", tp));
  recipe.parallel = ParallelConfig{};
  recipe.parallel.dp = ranks > 1 ? ranks / tp : 1;
  recipe.parallel.tp = ranks > 1 ? tp : 1;
  recipe.precision = PrecisionConfig{};
  recipe.recompute = RecomputeConfig{};
  recipe.batch = BatchConfig{};
  recipe.batch.micro = 1;
  recipe.batch.accum = 1;
  tm.plan = make_plan(recipe, ranks);
  if (ranks > 1) {
    tm.grid = std::make_shared<parallel::Grid>(std::move(world),
                                               parallel::GridShape{static_cast<int>(tm.plan.dp), static_cast<int>(tm.plan.tp), 1});
    tm.tp_rank = tm.grid->coords().tp;
  }
  const ModelLayout& layout = *tm.plan.layout;
  tm.logical = logical_template(layout, 0, 0, 1);
  load_checkpoint_file(tm.checkpoint, tm.logical, /*subset=*/true);
  tm.step = tm.logical.step;
  tm.logical.adam_m.clear();
  tm.logical.adam_v.clear();
  TrainState local;
  local.params = init_params(layout.rank_params(0, tm.tp_rank), tm.model(), 0);
  load_local_from_logical(layout, 0, tm.tp_rank, tm.logical, local);
  tm.params = std::move(local.params);
  return tm;
}

void TrainedModel::bind(ops::Executor& ex, const ops::Graph& g) {
  bind_params(ex, g, params);
  if (grid && plan.tp > 1) ex.set_group(&grid->tp());
}

const ops::Tensor& TrainedModel::full_vocab(const ops::Tensor& L) {
  if (!grid || plan.tp <= 1) return L;
  // L: (rows, Vp / tp), this rank's vocabulary columns. The gather stacks rank r's block at
  // r * rows * Vs; the full row i is [rank 0's row i | rank 1's row i | ...].
  const int64_t t = plan.tp, rows = L.shape().front(), Vs = L.shape().back(), n = rows * Vs;
  std::vector<float> all(static_cast<size_t>(n * t));
  grid->tp().allgather(L.data<float>(), all.data(), n);
  if (gathered.numel() != n * t || gathered.shape().front() != rows)
    gathered = ops::Tensor::empty({rows, Vs * t}, ops::DType::F32, ops::Account::Workspace);
  float* out = gathered.data<float>();
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::copy(all.begin() + r * n + i * Vs, all.begin() + r * n + (i + 1) * Vs, out + i * Vs * t + r * Vs);
  return gathered;
}

std::vector<float> full_forward_logits(TrainedModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  RUNNER_CHECK(static_cast<int64_t>(tokens.size()) == B * T, "full_forward_logits: tokens are not B x T");
  GptSpec spec = m.spec();
  spec.B = B;
  spec.T = T;
  ops::Graph g = build_gpt_graph(spec);
  ops::Executor ex(g, ops::cpu_backend());
  m.bind(ex, g);
  const ops::Tensor& L = m.full_vocab(ex.forward_logits(tokens.data()));
  const int64_t Vp = L.shape().back(), V = m.model().vocab_size;
  std::vector<float> out(static_cast<size_t>(B * T * V));
  const float* p = L.data<float>();
  for (int64_t r = 0; r < B * T; ++r) std::copy(p + r * Vp, p + r * Vp + V, out.begin() + r * V);
  return out;
}

}  // namespace runner
