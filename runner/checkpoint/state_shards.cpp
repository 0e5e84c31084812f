// Between shards and logical tensors (see state_shards.h).
#include "runner/checkpoint/state_shards.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"
#include "runner/model/model.h"
#include "runner/train/optimizer.h"

namespace runner {

namespace {

bool is_vocab_tensor(const std::string& name) { return name == "wte" || name == "lm_head.weight"; }

// Logical index of shard element i, or -1 for a vocabulary padding row.
int64_t logical_index(const ops::TensorDesc& d, int64_t i, int64_t vocab) {
  int64_t full = shard_to_full_index(d, i);
  if (is_vocab_tensor(d.name) && full >= vocab * d.full_shape.back()) return -1;
  return full;
}

int64_t numel(const std::vector<int64_t>& s) { return ops::numel_of(s); }

constexpr int kTagState = 70;

// Adam moment `which` (1: m, 2: v) of parameter i as a full local tensor in `full` (numel of
// the parameter, zeroed): this rank's ZeRO-1 piece placed in it and, when ZeRO shards the
// parameter, summed over the data-parallel group (a collective on it), so every dp rank ends
// with the whole moment. Zeros before the first update.
void full_moment(const TrainState& local, size_t i, int which, parallel::Communicator& dp, float* full) {
  const ParamSet& ps = local.params;
  if (!local.adam_m.empty()) {
    const ops::Tensor& m = (which == 1 ? local.adam_m : local.adam_v)[i];
    auto [a, e] = ps.owned_range(i);
    if (e > a) std::memcpy(full + a, m.raw(), static_cast<size_t>(e - a) * sizeof(float));
  }
  if (ps.zero_sharded(i)) dp.allreduce_sum(full, ps.values[i].numel());
}

}  // namespace

ops::Graph rank_param_graph(const Plan& plan, int stage, int64_t tp_rank) {
  if (plan.chunks <= 1) return build_gpt_graph(plan.stage_spec(stage, tp_rank));
  ops::Graph merged;
  for (int64_t k = 0; k < plan.chunks; ++k) {
    ops::Graph cg = build_gpt_graph(plan.chunk_spec(static_cast<int>(k * plan.pp + stage), tp_rank));
    for (int id : cg.params) {
      const ops::TensorDesc& d = cg.tensors[static_cast<size_t>(id)];
      if (merged.find(d.name) >= 0) continue;
      int nid = merged.add_param(d.name, d.shape, d.layer, d.decay, d.shard, d.full_shape);
      merged.tensors[static_cast<size_t>(nid)].seq_partial = d.seq_partial;
    }
  }
  return merged;
}

std::vector<int64_t> logical_shape(const ops::TensorDesc& d, int64_t vocab) {
  std::vector<int64_t> s = d.full_shape;
  if (is_vocab_tensor(d.name)) s[0] = vocab;
  return s;
}

void shard_to_logical(const ops::TensorDesc& d, const float* shard, float* logical, int64_t vocab) {
  const int64_t n = numel(d.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = logical_index(d, i, vocab);
    if (j >= 0) logical[j] = shard[i];
  }
}

void logical_to_shard(const ops::TensorDesc& d, const float* logical, float* shard, int64_t vocab) {
  const int64_t n = numel(d.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = logical_index(d, i, vocab);
    shard[i] = j >= 0 ? logical[j] : 0.0f;
  }
}

TrainState gather_logical_state(const Plan& plan, parallel::Grid& grid, const ops::Graph& g, const TrainState& local) {
  const int64_t vocab = plan.recipe.model.vocab_size;
  const parallel::Coords me = grid.coords();
  const parallel::GridShape& shape = grid.shape();
  const ParamSet& ps = local.params;
  // 1. Full local moments (ZeRO pieces assembled over dp; zeros before the first update).
  std::vector<ops::Tensor> m(ps.values.size()), v(ps.values.size());
  for (size_t i = 0; i < ps.values.size(); ++i) {
    if (!ps.zero_sharded(i) && me.dp != 0) continue;  // only the sending replica needs them
    m[i] = ops::Tensor::zeros(ps.values[i].shape(), ops::DType::F32, ops::Account::Workspace);
    v[i] = ops::Tensor::zeros(ps.values[i].shape(), ops::DType::F32, ops::Account::Workspace);
    full_moment(local, i, 1, grid.dp(), m[i].data<float>());
    full_moment(local, i, 2, grid.dp(), v[i].data<float>());
  }
  // 2. Scalars are rank 0's (identical everywhere).
  TrainState out;
  out.copy_scalars_from(local);
  out.recipe_yaml = local.recipe_yaml;
  out.world_rank = 0;
  out.world_size = grid.world_size();
  // 3. Replica dp 0 of every (stage, tp) shard sends to world rank 0, parameter by parameter in
  //    graph order; the tied embedding is taken from the first stage only.
  auto sends = [](const ops::TensorDesc& d, int stage) { return !(stage > 0 && d.name == "wte"); };
  if (me.dp == 0 && grid.rank() != 0) {
    for (int id : g.params) {
      const ops::TensorDesc& d = g.tensors[id];
      int i = ps.index(d.name);
      if (!sends(d, me.pp) || g.find(d.name) != id) continue;
      grid.world().send(ps.values[static_cast<size_t>(i)].raw(), ps.values[static_cast<size_t>(i)].nbytes(), 0, kTagState);
      grid.world().send(m[static_cast<size_t>(i)].raw(), m[static_cast<size_t>(i)].nbytes(), 0, kTagState);
      grid.world().send(v[static_cast<size_t>(i)].raw(), v[static_cast<size_t>(i)].nbytes(), 0, kTagState);
    }
  }
  if (grid.rank() != 0) return out;
  std::map<std::string, size_t> slot;
  std::vector<float> buf;
  for (int s = 0; s < shape.pp; ++s) {
    for (int t = 0; t < shape.tp; ++t) {
      const int src = parallel::world_rank_of(shape, {0, t, s});
      ops::Graph sg = src == 0 ? ops::Graph() : rank_param_graph(plan, s, t);
      const ops::Graph& gg = src == 0 ? g : sg;
      for (int id : gg.params) {
        const ops::TensorDesc& d = gg.tensors[id];
        if (!sends(d, s) || gg.find(d.name) != id) continue;
        auto it = slot.find(d.name);
        if (it == slot.end()) {
          auto lshape = logical_shape(d, vocab);
          out.params.names.push_back(d.name);
          out.params.values.push_back(ops::Tensor::zeros(lshape, ops::DType::F32, ops::Account::Workspace));
          out.adam_m.push_back(ops::Tensor::zeros(lshape, ops::DType::F32, ops::Account::Workspace));
          out.adam_v.push_back(ops::Tensor::zeros(lshape, ops::DType::F32, ops::Account::Workspace));
          out.params.decay.push_back(d.decay);
          it = slot.emplace(d.name, out.params.names.size() - 1).first;
        }
        const size_t j = it->second;
        const size_t n = static_cast<size_t>(numel(d.shape));
        const float* parts[3];
        std::vector<float> tmp[3];
        if (src == 0) {
          int i = ps.index(d.name);
          parts[0] = ps.values[static_cast<size_t>(i)].data<float>();
          parts[1] = m[static_cast<size_t>(i)].data<float>();
          parts[2] = v[static_cast<size_t>(i)].data<float>();
        } else {
          for (int k = 0; k < 3; ++k) {
            tmp[k].resize(n);
            grid.world().recv(tmp[k].data(), n * sizeof(float), src, kTagState);
            parts[k] = tmp[k].data();
          }
        }
        shard_to_logical(d, parts[0], out.params.values[j].data<float>(), vocab);
        shard_to_logical(d, parts[1], out.adam_m[j].data<float>(), vocab);
        shard_to_logical(d, parts[2], out.adam_v[j].data<float>(), vocab);
      }
    }
  }
  return out;
}

TensorSlice shard_slice(const ops::TensorDesc& d, int64_t vocab, int tp_rank, const float* src) {
  TensorSlice sl;
  sl.src = src;
  const auto& S = d.shape;
  const auto& F = d.full_shape;
  const std::vector<int64_t> L = logical_shape(d, vocab);
  RUNNER_CHECK(!S.empty() && S.size() == F.size(), "parameter " + d.name + " has no dimensions or no full shape");
  sl.src_row_elems = S[0] ? numel(S) / S[0] : 0;
  const bool split = d.shard.dim >= 0 && d.shard.parts > 1;
  if (!split) {  // replicated: one copy, from tensor-parallel rank 0
    if (tp_rank == 0 && std::min(S[0], L[0]) > 0) sl.runs.push_back({0, 0, std::min(S[0], L[0])});
    return sl;
  }
  const int dd = d.shard.dim, b = d.shard.blocks;
  RUNNER_CHECK(dd < static_cast<int>(S.size()) && b >= 1 && S[static_cast<size_t>(dd)] % b == 0 && F[static_cast<size_t>(dd)] % b == 0,
               "parameter " + d.name + " has an inconsistent shard spec");
  const int64_t sb = S[static_cast<size_t>(dd)] / b, fb = F[static_cast<size_t>(dd)] / b;
  if (dd == 0) {  // one run of rows per block; rows past the logical (vocabulary) end are padding
    for (int k = 0; k < b; ++k) {
      const int64_t dst = k * fb + d.shard.index * sb;
      const int64_t rows = std::clamp<int64_t>(L[0] - dst, 0, sb);
      if (rows > 0) sl.runs.push_back({k * sb, dst, rows});
    }
    return sl;
  }
  // A split inside the row: every row of the shard, and in it `b` blocks of `sb` along dim dd.
  const int64_t rows = std::min(S[0], L[0]);
  if (rows > 0) sl.runs.push_back({0, 0, rows});
  sl.split_dim = dd;
  sl.start = d.shard.index * sb;
  sl.stride = fb;
  sl.count = b;
  sl.block = sb;
  return sl;
}

void save_sharded(CheckpointManager& mgr, const Plan& plan, parallel::Grid& grid, const ops::Graph& g, const TrainState& local) {
  parallel::Communicator& world = grid.world();
  // 1. A failed background write (rank 0's manager) fails every rank; a step already saved is
  //    skipped by every rank (the managers of other ranks may not know of it).
  std::exception_ptr pending;
  try {
    mgr.wait();
  } catch (...) {
    pending = std::current_exception();
  }
  int64_t flags[2] = {pending ? 1 : 0, mgr.last_saved_step() == local.step ? 1 : 0};
  world.allreduce_max(flags, 2);
  if (flags[0]) {
    if (pending) std::rethrow_exception(pending);
    throw std::runtime_error("checkpoint: an earlier background checkpoint write failed on rank 0 (see its log)");
  }
  if (flags[1]) return;

  // 2. Every logical tensor, in the order gather_logical_state produces them: stage by stage,
  //    parameters in graph order, the first stage holding a name writes it (the tied embedding:
  //    the first stage). Identical on every rank.
  const int64_t vocab = plan.recipe.model.vocab_size;
  const parallel::Coords me = grid.coords();
  std::vector<CollectiveTensor> tensors;
  std::map<std::string, size_t> slot;
  std::vector<int> writer_stage;
  for (int s = 0; s < grid.shape().pp; ++s) {
    const ops::Graph sg = rank_param_graph(plan, s, 0);
    for (int id : sg.params) {
      const ops::TensorDesc& d = sg.tensors[id];
      if (slot.count(d.name)) continue;
      slot.emplace(d.name, tensors.size());
      tensors.push_back({d.name, logical_shape(d, vocab)});
      writer_stage.push_back(s);
    }
  }
  // 3. This rank's shards of them (its stage writes them; dp rank 0 of each shard writes).
  const ParamSet& ps = local.params;
  std::vector<int> desc(tensors.size(), -1), index(tensors.size(), -1);
  for (int id : g.params) {
    const ops::TensorDesc& d = g.tensors[id];
    auto it = slot.find(d.name);
    RUNNER_CHECK(it != slot.end(), "parameter " + d.name + " of this rank is not in the plan's graphs");
    if (g.find(d.name) != id || writer_stage[it->second] != me.pp) continue;
    desc[it->second] = id;
    index[it->second] = ps.index(d.name);
    RUNNER_CHECK(index[it->second] >= 0, "parameter " + d.name + " missing from this rank's state");
  }
  const bool have_moments = !local.adam_m.empty();
  std::vector<float> full;  // a ZeRO-1 moment assembled over dp (one at a time)
  auto slice = [&](int which, size_t j) -> TensorSlice {
    if (desc[j] < 0) return {};
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(desc[j])];
    const size_t i = static_cast<size_t>(index[j]);
    const int64_t n = numel(d.shape);
    const float* src = nullptr;
    if (which == 0) {
      src = ps.values[i].data<float>();
    } else {
      if (ps.zero_sharded(i)) {  // every dp rank of this shard takes part (the same sequence on each)
        full.assign(static_cast<size_t>(n), 0.0f);
        full_moment(local, i, which, grid.dp(), full.data());
        src = full.data();
      } else if (have_moments) {
        const ops::Tensor& m = (which == 1 ? local.adam_m : local.adam_v)[i];
        RUNNER_CHECK(m.numel() == n && m.dtype() == ops::DType::F32, "moment of " + d.name + " must be fp32 " + ps.values[i].shape_str());
        src = m.data<float>();
      }  // else: zeros (no update yet)
    }
    if (me.dp != 0) return {};
    return shard_slice(d, vocab, me.tp, src);
  };
  const bool publisher = grid.rank() == 0;
  mgr.save_external(
      local.step, [&] { return write_checkpoint_collective(world, mgr.dir(), local, tensors, slice, mgr.write_options()); },
      publisher);
}

TrainState logical_template(const ops::Graph& g, int64_t vocab, int world_rank, int world_size) {
  TrainState t;
  for (int id : g.params) {
    const ops::TensorDesc& d = g.tensors[id];
    if (t.params.index(d.name) >= 0) continue;
    t.params.names.push_back(d.name);
    t.params.values.push_back(ops::Tensor::zeros(logical_shape(d, vocab), ops::DType::F32, ops::Account::Workspace));
    t.params.decay.push_back(d.decay);
  }
  t.world_rank = world_rank;
  t.world_size = world_size;
  return t;
}

void load_local_from_logical(const ops::Graph& g, int64_t vocab, const TrainState& logical, TrainState& local) {
  ParamSet& ps = local.params;
  const bool moments = !logical.adam_m.empty();
  if (moments && local.adam_m.size() != ps.values.size()) {
    local.adam_m.clear();
    local.adam_v.clear();
    for (size_t i = 0; i < ps.values.size(); ++i) {
      local.adam_m.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer);
      local.adam_v.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer);
    }
  }
  for (int id : g.params) {
    const ops::TensorDesc& d = g.tensors[id];
    if (g.find(d.name) != id) continue;
    int i = ps.index(d.name), j = logical.params.index(d.name);
    RUNNER_CHECK(i >= 0 && j >= 0, "parameter " + d.name + " missing when loading the logical state");
    logical_to_shard(d, logical.params.values[static_cast<size_t>(j)].data<float>(), ps.values[static_cast<size_t>(i)].data<float>(), vocab);
    if (!moments) continue;
    auto [a, e] = ps.owned_range(static_cast<size_t>(i));
    std::vector<float> tmp(static_cast<size_t>(numel(d.shape)));
    for (int which = 0; which < 2; ++which) {
      const ops::Tensor& src = (which == 0 ? logical.adam_m : logical.adam_v)[static_cast<size_t>(j)];
      ops::Tensor& dst = (which == 0 ? local.adam_m : local.adam_v)[static_cast<size_t>(i)];
      logical_to_shard(d, src.data<float>(), tmp.data(), vocab);
      if (e > a) std::memcpy(dst.raw(), tmp.data() + a, static_cast<size_t>(e - a) * sizeof(float));
    }
  }
  local.copy_scalars_from(logical);
  local.recipe_yaml = logical.recipe_yaml;
}

}  // namespace runner
