#include "runner/generate/trained_model.h"

#include <filesystem>

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

TrainedModel load_trained_model(const std::string& src, const std::vector<std::string>& overrides) {
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
  // One rank, fp32, nothing recomputed; the batch is one sequence (generation builds its own graphs).
  recipe.parallel = ParallelConfig{};
  recipe.parallel.dp = 1;
  recipe.precision = PrecisionConfig{};
  recipe.recompute = RecomputeConfig{};
  recipe.batch = BatchConfig{};
  recipe.batch.micro = 1;
  recipe.batch.accum = 1;
  tm.plan = make_plan(recipe, 1);
  const ModelLayout& layout = *tm.plan.layout;
  tm.logical = logical_template(layout, 0, 0, 1);
  load_checkpoint_file(tm.checkpoint, tm.logical, /*subset=*/true);
  tm.step = tm.logical.step;
  tm.logical.adam_m.clear();
  tm.logical.adam_v.clear();
  TrainState local;
  local.params = init_params(layout.rank_params(0, 0), tm.model(), 0);
  load_local_from_logical(layout, 0, 0, tm.logical, local);
  tm.params = std::move(local.params);
  return tm;
}

std::vector<float> full_forward_logits(TrainedModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  RUNNER_CHECK(static_cast<int64_t>(tokens.size()) == B * T, "full_forward_logits: tokens are not B x T");
  GptSpec spec = m.plan.layout->spec(0, 0);
  spec.B = B;
  spec.T = T;
  ops::Graph g = build_gpt_graph(spec);
  ops::Executor ex(g, ops::cpu_backend());
  bind_params(ex, g, m.params);
  const ops::Tensor& L = ex.forward_logits(tokens.data());
  const int64_t Vp = L.shape().back(), V = m.model().vocab_size;
  std::vector<float> out(static_cast<size_t>(B * T * V));
  const float* p = L.data<float>();
  for (int64_t r = 0; r < B * T; ++r) std::copy(p + r * Vp, p + r * Vp + V, out.begin() + r * V);
  return out;
}

}  // namespace runner
