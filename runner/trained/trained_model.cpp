#include "runner/trained/trained_model.h"

#include <filesystem>

#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/run/run_dir.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

const ops::Tensor& TrainedModel::logical_tensor(const std::string& name) const {
  const int i = logical.params.index(name);
  RUNNER_CHECK(i >= 0, "parameter " + name + " missing from the loaded model");
  return logical.params.values[static_cast<size_t>(i)];
}

TrainedModel load_trained_model(const std::string& src, ops::Backend& be, const std::vector<std::string>& overrides,
                                std::unique_ptr<parallel::Communicator> world) {
  TrainedModel tm;
  tm.backend = &be;
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
  if (const std::string tok = run_tokenizer_dir(source_run_dir(src)); fs::is_directory(tok)) tm.tokenizer_dir = tok;
  // fp32, nothing recomputed; the batch is one sequence (generation builds its own graphs). One
  // process: one rank. Several: the recipe's tensor-parallel layout, each dp replica the same.
  const int64_t ranks = world ? world->size() : 1;
  const int64_t tp = recipe.parallel.tp;
  const int64_t pp = recipe.parallel.pp;
  const std::vector<int64_t> stage_layers = recipe.parallel.stage_layers;
  if (ranks > 1 && ranks % (tp * pp) != 0)
    throw UserError({tm.checkpoint, 0, 0},
                    fmt::format("{} ranks are not a multiple of the recipe's tp x pp = {}", ranks, tp * pp),
                    fmt::format("start a multiple of {} ranks (each tp x pp group generates the same)", tp * pp));
  recipe.parallel = ParallelConfig{};
  recipe.parallel.dp = ranks > 1 ? ranks / (tp * pp) : 1;
  recipe.parallel.tp = ranks > 1 ? tp : 1;
  recipe.parallel.pp = ranks > 1 ? pp : 1;
  if (ranks > 1) recipe.parallel.stage_layers = stage_layers;
  recipe.precision = PrecisionConfig{};
  recipe.recompute = RecomputeConfig{};
  recipe.batch = BatchConfig{};
  recipe.batch.micro = 1;
  recipe.batch.accum = recipe.parallel.pp;  // the plan's pipeline rule (accum >= pp); generation does not use it
  tm.plan = make_plan(recipe, ranks);
  if (ranks > 1) {
    tm.grid = std::make_shared<parallel::Grid>(std::move(world),
                                               parallel::GridShape{static_cast<int>(tm.plan.dp), static_cast<int>(tm.plan.tp),
                                                                   static_cast<int>(tm.plan.pp)});
    tm.tp_rank = tm.grid->coords().tp;
    tm.stage = tm.grid->coords().pp;
  }
  const ModelLayout& layout = *tm.plan.layout;
  tm.logical = logical_template(layout, tm.stage, 0, 1);
  load_checkpoint_file(tm.checkpoint, tm.logical, /*subset=*/true);
  tm.step = tm.logical.step;
  tm.logical.adam_m.clear();
  tm.logical.adam_v.clear();
  TrainState local;
  local.params = init_params(layout.rank_params(tm.stage, tm.tp_rank), tm.model(), 0);
  load_local_from_logical(layout, tm.stage, tm.tp_rank, tm.logical, local);
  tm.params = std::move(local.params);
  return tm;
}

void TrainedModel::bind(ops::Executor& ex, const ops::Graph& g) {
  bind_params(ex, g, params);
  if (grid && plan.tp > 1) ex.set_group(&grid->tp().tensors());
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

const ops::Tensor& TrainedModel::logits(ops::Executor& ex, const ops::Graph& g, const int32_t* tokens) {
  if (!grid || plan.pp <= 1) return full_vocab(ex.forward_logits(tokens));
  parallel::Grid& G = *grid;
  constexpr int kTag = 0x6e6;  // generation's activations, stage to stage
  std::vector<char> in;
  if (g.stage_input >= 0) {
    in.resize(g.tensors[static_cast<size_t>(g.stage_input)].nbytes());
    G.world().recv(in.data(), in.size(), G.prev_stage_rank(), kTag);
  }
  const int64_t rows = g.B * g.T, Vp = spec().vocab_padded ? spec().vocab_padded : padded_vocab(model().vocab_size, plan.tp);
  if (pp_logits.numel() != rows * Vp) pp_logits = ops::Tensor::empty({rows, Vp}, ops::DType::F32, ops::Account::Workspace);
  if (!G.last_stage()) {
    std::vector<char> out(g.tensors[static_cast<size_t>(g.stage_output)].nbytes());
    ex.forward(tokens, nullptr, /*train=*/false, 0, 0, in.empty() ? nullptr : in.data(), out.data());
    G.world().send(out.data(), out.size(), G.next_stage_rank(), kTag);
  } else {
    const ops::Tensor& L = full_vocab(ex.forward_logits(tokens, in.empty() ? nullptr : in.data()));
    RUNNER_CHECK(L.numel() == rows * Vp, "pipeline generation: the last stage's logits are not rows x padded vocabulary");
    std::copy(L.data<float>(), L.data<float>() + rows * Vp, pp_logits.data<float>());
  }
  G.pp().broadcast(pp_logits.raw(), static_cast<size_t>(rows * Vp) * sizeof(float), static_cast<int>(plan.pp) - 1);
  return pp_logits;
}

FullForward::FullForward(TrainedModel& m, int64_t B, int64_t T)
    : model(m),
      graph([&] {
        GptSpec spec = m.spec();
        spec.B = B;
        spec.T = T;
        return build_gpt_graph(spec);
      }()),
      ex(graph, *m.backend) {
  m.bind(ex, graph);
}

std::vector<float> full_forward_logits(TrainedModel& m, const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  RUNNER_CHECK(static_cast<int64_t>(tokens.size()) == B * T, "full_forward_logits: tokens are not B x T");
  FullForward f(m, B, T);
  const ops::Tensor& L = f.logits(tokens.data());
  const int64_t Vp = L.shape().back(), V = m.model().vocab_size;
  std::vector<float> out(static_cast<size_t>(B * T * V));
  const float* p = L.data<float>();
  for (int64_t r = 0; r < B * T; ++r) std::copy(p + r * Vp, p + r * Vp + V, out.begin() + r * V);
  return out;
}

}  // namespace runner
