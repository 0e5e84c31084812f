#include "runner/trained/trained_model.h"

#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/run/run_dir.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/device/device.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

// This rank's parameters (stage, tp_rank) cut out of the logical tensors read on the host,
// each copied into the device once (the crossing "weights in"). Gradients are allocated as
// the training graphs bind them, never written (generation runs no backward).
ParamSet device_params(const ModelLayout& layout, int stage, int64_t tp_rank, const TrainState& logical) {
  ParamSet ps;
  const std::vector<int>& held = layout.stage_params(stage);
  const std::vector<ops::TensorDesc> shards = layout.rank_params(stage, tp_rank);
  RUNNER_CHECK(held.size() == shards.size(), "rank_params and stage_params disagree");
  std::vector<float> host;
  for (size_t k = 0; k < held.size(); ++k) {
    const LogicalParam& p = layout.params()[static_cast<size_t>(held[k])];
    const ops::TensorDesc& d = shards[k];
    RUNNER_CHECK(d.dtype == ops::DType::F32, "generation lays the model out in fp32");
    const int j = logical.params.index(p.name);
    RUNNER_CHECK(j >= 0, "parameter " + p.name + " missing from the loaded checkpoint");
    host.assign(static_cast<size_t>(ops::numel_of(d.shape)), 0.0f);
    logical_to_shard(p, d, logical.params.values[static_cast<size_t>(j)].host_data<float>(), host.data());
    ops::Tensor v(d.shape, d.dtype, ops::Account::Parameters, /*zero=*/false);
    v.write_from_host(host.data());
    ps.names.push_back(p.name);
    ps.values.push_back(std::move(v));
    ps.grads.emplace_back(d.shape, d.grad_dtype, ops::Account::Gradients, /*zero=*/false);
    ps.decay.push_back(p.desc.decay);
  }
  return ps;
}

}  // namespace

ops::Tensor TrainedModel::logical_tensor(const std::string& name) const {
  RUNNER_CHECK(plan.tp == 1 && plan.pp == 1, "logical_tensor: the model is split over ranks (tp, pp): one rank holds part of it");
  const ModelLayout& layout = *plan.layout;
  const int k = layout.find(name), i = params.index(name);
  RUNNER_CHECK(k >= 0 && i >= 0, "parameter " + name + " missing from the loaded model");
  const LogicalParam& p = layout.params()[static_cast<size_t>(k)];
  const ops::Tensor& v = params.values[static_cast<size_t>(i)];
  std::vector<float> shard(static_cast<size_t>(v.numel()));
  v.read_to_host(shard.data());  // the crossing "weights out" (waits for them)
  ops::Tensor out = ops::Tensor::host(p.logical_shape, ops::DType::F32, ops::Account::Workspace);
  shard_to_logical(p, p.shard(0), shard.data(), out.host_data<float>());
  return out;
}

std::vector<float> logits_rows_to_host(const ops::Tensor& L, const std::vector<int64_t>& rows, int64_t V) {
  const int64_t Vp = L.shape().back();
  RUNNER_CHECK(L.dtype() == ops::DType::F32 && V <= Vp, "logits_rows_to_host: fp32 logits of at least V columns");
  std::vector<float> out(rows.size() * static_cast<size_t>(V));
  const size_t bytes = static_cast<size_t>(V) * sizeof(float);
  const auto* base = static_cast<const char*>(L.raw());
  ops::Backend* dev = L.device();
  for (size_t r = 0; r < rows.size(); ++r) {
    RUNNER_CHECK(rows[r] >= 0 && rows[r] * Vp < L.numel(), "logits_rows_to_host: a row outside the logits");
    const char* src = base + static_cast<size_t>(rows[r] * Vp) * sizeof(float);
    if (dev) dev->copy_out(out.data() + r * static_cast<size_t>(V), src, bytes);  // queued, one wait below
    else std::memcpy(out.data() + r * static_cast<size_t>(V), src, bytes);
  }
  if (dev) dev->synchronize();
  return out;
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
  // The device, once, after every check of the request and before the first tensor: from here
  // on every tensor is allocated in its memory (runner/device/device.h).
  tm.backend = &select_backend(tm.plan.recipe);
  ops::Backend* device = tm.backend->host_memory() ? nullptr : tm.backend;
  ops::set_tensor_device(device);  // a process may load several models (tests): this one's device
  if (ranks > 1) {
    tm.grid = std::make_shared<parallel::Grid>(std::move(world),
                                               parallel::GridShape{static_cast<int>(tm.plan.dp), static_cast<int>(tm.plan.tp),
                                                                   static_cast<int>(tm.plan.pp)},
                                               tm.backend);
    tm.tp_rank = tm.grid->coords().tp;
    tm.stage = tm.grid->coords().pp;
  }
  const ModelLayout& layout = *tm.plan.layout;
  // The checkpoint is read in host memory (whatever the reader allocates beside the values
  // too: the moments it skips past), then the parameters are copied in.
  ops::set_tensor_device(nullptr);
  TrainState logical = logical_template(layout, tm.stage, 0, 1);  // host memory: read, cut, copied in, dropped
  load_checkpoint_file(tm.checkpoint, logical, /*subset=*/true);
  tm.step = logical.step;
  logical.adam_m.clear();
  logical.adam_v.clear();
  ops::set_tensor_device(device);
  tm.params = device_params(layout, tm.stage, tm.tp_rank, logical);
  return tm;
}

void TrainedModel::bind(ops::Executor& ex, const ops::Graph& g) {
  bind_params(ex, g, params);
  if (grid && plan.tp > 1) ex.set_group(&grid->tp().tensors());
}

// Generation's traffic between ranks (the tp vocabulary shards, the pp activations and
// logits) crosses through host memory: small next to a step's, and the same host calls on
// every device (docs/invariants.md, invariant 7: named crossings, here "logits out").
const ops::Tensor& TrainedModel::full_vocab(const ops::Tensor& L) {
  if (!grid || plan.tp <= 1) return L;
  // L: (rows, Vp / tp), this rank's vocabulary columns. The gather stacks rank r's block at
  // r * rows * Vs; the full row i is [rank 0's row i | rank 1's row i | ...].
  const int64_t t = plan.tp, rows = L.shape().front(), Vs = L.shape().back(), n = rows * Vs;
  std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * t)), full(static_cast<size_t>(n * t));
  L.read_to_host(mine.data());
  grid->tp().allgather(mine.data(), all.data(), n);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::copy(all.begin() + r * n + i * Vs, all.begin() + r * n + (i + 1) * Vs, full.begin() + i * Vs * t + r * Vs);
  if (gathered.numel() != n * t || gathered.shape().front() != rows)
    gathered = ops::Tensor::empty({rows, Vs * t}, ops::DType::F32, ops::Account::Workspace);
  gathered.write_from_host(full.data());
  return gathered;
}

const ops::Tensor& TrainedModel::logits(ops::Executor& ex, const ops::Graph& g, const int32_t* tokens) {
  if (!grid || plan.pp <= 1) return full_vocab(ex.forward_logits(tokens));
  parallel::Grid& G = *grid;
  constexpr int kTag = 0x6e6;  // generation's activations, stage to stage
  // The executor takes and gives the stage activations in device memory.
  auto buffer = [&](int id) {
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(id)];
    return ops::Tensor::empty(d.shape, d.dtype, ops::Account::Communication);
  };
  std::vector<char> host;
  ops::Tensor in;
  if (g.stage_input >= 0) {
    in = buffer(g.stage_input);
    host.resize(in.nbytes());
    G.world().recv(host.data(), host.size(), G.prev_stage_rank(), kTag);
    in.write_from_host(host.data());
  }
  const int64_t rows = g.B * g.T, Vp = spec().vocab_padded ? spec().vocab_padded : padded_vocab(model().vocab_size, plan.tp);
  if (pp_logits.numel() != rows * Vp) pp_logits = ops::Tensor::empty({rows, Vp}, ops::DType::F32, ops::Account::Workspace);
  std::vector<float> lg(static_cast<size_t>(rows * Vp));
  if (!G.last_stage()) {
    ops::Tensor out = buffer(g.stage_output);
    ex.forward(tokens, nullptr, /*train=*/false, 0, 0, in.raw(), out.raw());
    host.resize(out.nbytes());
    out.read_to_host(host.data());
    G.world().send(host.data(), host.size(), G.next_stage_rank(), kTag);
  } else {
    const ops::Tensor& L = full_vocab(ex.forward_logits(tokens, in.raw()));
    RUNNER_CHECK(L.numel() == rows * Vp, "pipeline generation: the last stage's logits are not rows x padded vocabulary");
    pp_logits.copy_from(L);
    pp_logits.read_to_host(lg.data());
  }
  G.pp().broadcast(lg.data(), lg.size() * sizeof(float), static_cast<int>(plan.pp) - 1);
  if (!G.last_stage()) pp_logits.write_from_host(lg.data());
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
  std::vector<int64_t> rows(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r) rows[static_cast<size_t>(r)] = r;
  return logits_rows_to_host(f.logits(tokens.data()), rows, m.model().vocab_size);
}

}  // namespace runner
