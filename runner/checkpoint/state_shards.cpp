// Between shards and logical tensors (see state_shards.h).
#include "runner/checkpoint/state_shards.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

#include "ops/convert.h"
#include "ops/backend.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/staging.h"
#include "runner/errors.h"

namespace runner {

namespace {

// Logical index of element i of shard `d` of parameter `p`, or -1 for a vocabulary padding row.
int64_t logical_index(const LogicalParam& p, const ops::TensorDesc& d, int64_t i) {
  int64_t full = shard_to_full_index(d, i);
  if (p.vocab_rows && full >= p.logical_shape[0] * d.full_shape.back()) return -1;
  return full;
}

int64_t numel(const std::vector<int64_t>& s) { return ops::numel_of(s); }

constexpr int kTagState = 70;

// The crossings out of a tensor's memory (staging.h): t's fp32 values in host memory, read in
// place for a host tensor, else copied out (and waited for) into `buf`; and t's bytes into `dst`.
const float* host_f32(const ops::Tensor& t, std::vector<float>& buf) {
  if (t.on_host()) return t.host_data<float>();
  buf.resize(static_cast<size_t>(t.numel()));
  t.read_to_host(buf.data());
  return buf.data();
}
void read_host(const ops::Tensor& t, void* dst) {
  if (t.on_host()) std::memcpy(dst, t.host_raw(), t.nbytes());
  else t.read_to_host(dst);
}

// Adam moment `which` (1: m, 2: v) of parameter i as a full local tensor in `full` (numel of
// the parameter, zeroed): this rank's ZeRO-1 piece placed in it and, when ZeRO shards the
// parameter, summed over the data-parallel group (a collective on it), so every dp rank ends
// with the whole moment. Zeros before the first update.
void full_moment(const TrainState& local, size_t i, int which, parallel::Communicator& dp, float* full) {
  const ParamSet& ps = local.params;
  if (!local.adam_m.empty()) {
    const ops::Tensor& m = (which == 1 ? local.adam_m : local.adam_v)[i];
    auto [a, e] = ps.owned_range(i);
    if (e > a) read_host(m, full + a);
  }
  if (ps.zero_sharded(i)) dp.allreduce_sum(full, ps.values[i].numel());
}

// Parameter i's fp32 weights as a checkpoint stores them (/params): the fp32 masters when the
// run keeps them (a ZeRO-1 piece assembled over the data-parallel group when ZeRO shards the
// parameter: a collective on it, called by every dp rank alike), else the values, widened
// exactly when they are 16-bit. `buf` holds them when a copy is needed.
const float* param_fp32(const TrainState& local, size_t i, parallel::Communicator& dp, std::vector<float>& buf) {
  const ParamSet& ps = local.params;
  const ops::Tensor& v = ps.values[i];
  const int64_t n = v.numel();
  if (!local.masters.empty()) {
    const ops::Tensor& m = local.masters[i];
    if (!ps.zero_sharded(i) && m.numel() == n) return host_f32(m, buf);
    buf.assign(static_cast<size_t>(n), 0.0f);
    auto [a, e] = ps.owned_range(i);
    if (e > a) read_host(m, buf.data() + a);
    if (ps.zero_sharded(i)) dp.allreduce_sum(buf.data(), n);
    return buf.data();
  }
  if (v.dtype() == ops::DType::F32) return host_f32(v, buf);
  std::vector<char> raw;  // the 16-bit values, widened exactly on the host
  const void* p = host_bytes(v, raw);
  buf.resize(static_cast<size_t>(n));
  ops::to_f32(buf.data(), p, v.dtype(), n);
  return buf.data();
}

// This rank's parameters: (its ParamSet index, the logical parameter) in stage_params order.
std::vector<std::pair<size_t, const LogicalParam*>> held(const ModelLayout& layout, int stage, const ParamSet& ps) {
  std::vector<std::pair<size_t, const LogicalParam*>> out;
  for (int k : layout.stage_params(stage)) {
    const LogicalParam& p = layout.params()[static_cast<size_t>(k)];
    int i = ps.index(p.name);
    RUNNER_CHECK(i >= 0, "parameter " + p.name + " missing from this rank's state");
    out.emplace_back(static_cast<size_t>(i), &p);
  }
  return out;
}

}  // namespace

void shard_to_logical(const LogicalParam& p, const ops::TensorDesc& d, const float* shard, float* logical) {
  const int64_t n = numel(d.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = logical_index(p, d, i);
    if (j >= 0) logical[j] = shard[i];
  }
}

void logical_to_shard(const LogicalParam& p, const ops::TensorDesc& d, const float* logical, float* shard) {
  const int64_t n = numel(d.shape);
  for (int64_t i = 0; i < n; ++i) {
    int64_t j = logical_index(p, d, i);
    shard[i] = j >= 0 ? logical[j] : 0.0f;
  }
}

TrainState gather_logical_state(const ModelLayout& layout, parallel::Grid& grid, const TrainState& local) {
  const parallel::Coords me = grid.coords();
  const parallel::GridShape& shape = grid.shape();
  const ParamSet& ps = local.params;
  // 1. Full local moments and fp32 weights (ZeRO pieces assembled over dp; zeros before the
  //    first update).
  std::vector<ops::Tensor> m(ps.values.size()), v(ps.values.size());
  std::vector<std::vector<float>> wbuf(ps.values.size());
  std::vector<const float*> w(ps.values.size(), nullptr);
  for (size_t i = 0; i < ps.values.size(); ++i) {
    if (!ps.zero_sharded(i) && me.dp != 0) continue;  // only the sending replica needs them
    w[i] = param_fp32(local, i, grid.dp(), wbuf[i]);
    m[i] = ops::Tensor::host(ps.values[i].shape(), ops::DType::F32, ops::Account::Workspace);
    v[i] = ops::Tensor::host(ps.values[i].shape(), ops::DType::F32, ops::Account::Workspace);
    full_moment(local, i, 1, grid.dp(), m[i].host_data<float>());
    full_moment(local, i, 2, grid.dp(), v[i].host_data<float>());
  }
  // 2. Scalars are rank 0's (identical everywhere).
  TrainState out;
  out.copy_scalars_from(local);
  out.recipe_yaml = local.recipe_yaml;
  out.world_rank = 0;
  out.world_size = grid.world_size();
  // 3. Replica dp 0 of every (stage, tp) shard sends to world rank 0 the parameters its stage
  //    writes (the tied embedding: the first stage), in stage_params order.
  if (me.dp == 0 && grid.rank() != 0) {
    for (auto [i, p] : held(layout, me.pp, ps)) {
      if (p->writer_stage() != me.pp) continue;
      grid.world().send(w[i], static_cast<size_t>(ps.values[i].numel()) * sizeof(float), 0, kTagState);
      grid.world().send(m[i].host_raw(), m[i].nbytes(), 0, kTagState);
      grid.world().send(v[i].host_raw(), v[i].nbytes(), 0, kTagState);
    }
  }
  if (grid.rank() != 0) return out;
  // 4. Rank 0 assembles the logical tensors, in the layout's table order.
  const auto& table = layout.params();
  for (const LogicalParam& p : table) {
    out.params.names.push_back(p.name);
    // The logical state is assembled in host memory (what the writer thread reads).
    out.params.values.push_back(ops::Tensor::host(p.logical_shape, ops::DType::F32, ops::Account::Workspace));
    out.adam_m.push_back(ops::Tensor::host(p.logical_shape, ops::DType::F32, ops::Account::Workspace));
    out.adam_v.push_back(ops::Tensor::host(p.logical_shape, ops::DType::F32, ops::Account::Workspace));
    out.params.decay.push_back(p.desc.decay);
  }
  std::vector<float> tmp[3];
  for (int s = 0; s < shape.pp; ++s) {
    for (int t = 0; t < shape.tp; ++t) {
      const int src = parallel::world_rank_of(shape, {0, t, s});
      for (int k : layout.stage_params(s)) {
        const LogicalParam& p = table[static_cast<size_t>(k)];
        if (p.writer_stage() != s) continue;
        const ops::TensorDesc d = p.shard(t);
        const size_t n = static_cast<size_t>(numel(d.shape));
        const float* parts[3];
        if (src == 0) {
          const size_t i = static_cast<size_t>(ps.index(p.name));
          parts[0] = w[i];
          parts[1] = m[i].host_data<float>();
          parts[2] = v[i].host_data<float>();
        } else {
          for (int c = 0; c < 3; ++c) {
            tmp[c].resize(n);
            grid.world().recv(tmp[c].data(), n * sizeof(float), src, kTagState);
            parts[c] = tmp[c].data();
          }
        }
        const size_t j = static_cast<size_t>(k);
        shard_to_logical(p, d, parts[0], out.params.values[j].host_data<float>());
        shard_to_logical(p, d, parts[1], out.adam_m[j].host_data<float>());
        shard_to_logical(p, d, parts[2], out.adam_v[j].host_data<float>());
      }
    }
  }
  return out;
}

TensorSlice shard_slice(const LogicalParam& p, int tp_rank, const float* src) {
  const ops::TensorDesc d = p.shard(tp_rank);
  TensorSlice sl;
  sl.src = src;
  const auto& S = d.shape;
  const auto& F = d.full_shape;
  const std::vector<int64_t>& L = p.logical_shape;
  RUNNER_CHECK(!S.empty() && S.size() == F.size(), "parameter " + d.name + " has no dimensions or no full shape");
  sl.src_row_elems = S[0] ? numel(S) / S[0] : 0;
  const bool split = d.shard.dim >= 0 && d.shard.parts > 1;
  if (!split) {  // replicated: one copy, from tensor-parallel rank 0
    if (tp_rank == 0 && std::min(S[0], L[0]) > 0) sl.runs.push_back({0, 0, std::min(S[0], L[0])});
    return sl;
  }
  const int dd = d.shard.dim, b = d.shard.blocks;
  RUNNER_CHECK(dd < static_cast<int>(S.size()) && d.shard.shard_len(F[static_cast<size_t>(dd)]) == S[static_cast<size_t>(dd)],
               "parameter " + d.name + " has an inconsistent shard spec");
  if (dd == 0) {  // one run of rows per block; rows past the logical (vocabulary) end are padding
    for (const ops::ShardSpec::Run& r : d.shard.runs(F[0])) {
      if (r.replicated && tp_rank != 0) continue;  // a block every rank holds: written once
      const int64_t rows = std::clamp<int64_t>(L[0] - r.full, 0, r.len);
      if (rows > 0) sl.runs.push_back({r.shard, r.full, rows});
    }
    return sl;
  }
  RUNNER_CHECK(d.shard.sizes.empty() && d.shard.replicated == 0 && b >= 1 && S[static_cast<size_t>(dd)] % b == 0,
               "parameter " + d.name + ": unequal or replicated blocks are only supported along dimension 0");
  const int64_t sb = S[static_cast<size_t>(dd)] / b, fb = F[static_cast<size_t>(dd)] / b;
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

SaveResult write_sharded(const ModelLayout& layout, parallel::Grid& grid, const std::string& dir,
                         const TrainState& local, const WriteOptions& opt) {
  parallel::Communicator& world = grid.world();
  // Every logical tensor, in the layout's table order (what gather_logical_state produces).
  const parallel::Coords me = grid.coords();
  const auto& table = layout.params();
  std::vector<CollectiveTensor> tensors;
  for (const LogicalParam& p : table) tensors.push_back({p.name, p.logical_shape});
  // This rank's shards of them: the ones its stage writes (dp rank 0 of each shard writes).
  const ParamSet& ps = local.params;
  std::vector<int> index(table.size(), -1);
  for (auto [i, p] : held(layout, me.pp, ps))
    if (p->writer_stage() == me.pp) index[static_cast<size_t>(p - table.data())] = static_cast<int>(i);
  const bool have_moments = !local.adam_m.empty();
  std::vector<float> full;  // a ZeRO-1 moment assembled over dp (one at a time)
  auto slice = [&](int which, size_t j) -> TensorSlice {
    if (index[j] < 0) return {};
    const LogicalParam& p = table[j];
    const size_t i = static_cast<size_t>(index[j]);
    const int64_t n = ps.values[i].numel();
    const float* src = nullptr;
    if (which == 0) {
      src = param_fp32(local, i, grid.dp(), full);
    } else {
      if (ps.zero_sharded(i)) {  // every dp rank of this shard takes part (the same sequence on each)
        full.assign(static_cast<size_t>(n), 0.0f);
        full_moment(local, i, which, grid.dp(), full.data());
        src = full.data();
      } else if (have_moments) {
        const ops::Tensor& m = (which == 1 ? local.adam_m : local.adam_v)[i];
        RUNNER_CHECK(m.numel() == n && m.dtype() == ops::DType::F32, "moment of " + p.name + " must be fp32 " + ps.values[i].shape_str());
        src = host_f32(m, full);
      }  // else: zeros (no update yet)
    }
    if (me.dp != 0) return {};
    return shard_slice(p, me.tp, src);
  };
  return write_checkpoint_collective(world, dir, local, tensors, slice, opt);
}

TrainState fp32_weights_view(const TrainState& s) {
  TrainState v;
  copy_state_meta(v, s);
  v.adam_m = s.adam_m;  // shared, not copied
  v.adam_v = s.adam_v;
  for (size_t i = 0; i < s.params.values.size(); ++i) {
    const ops::Tensor& x = s.params.values[i];
    if (!s.masters.empty()) {
      RUNNER_CHECK(s.masters[i].shape() == x.shape(), "master weights of " + s.params.names[i] + " are sharded");
      v.params.values.push_back(s.masters[i]);
    } else if (x.dtype() == ops::DType::F32) {
      v.params.values.push_back(x);
    } else {
      // Widened where the values live: on a device, by its convert kernel (queued; the save
      // stages the result out); on the host, as before.
      ops::Tensor w(x.shape(), ops::DType::F32, ops::Account::Workspace, /*zero=*/false, x.device());
      if (x.on_host()) ops::to_f32(w.host_data<float>(), x.host_raw(), x.dtype(), x.numel());
      else x.device()->run(ops::k::Convert(w.raw(), ops::DType::F32, x.raw(), x.dtype(), x.numel()));
      v.params.values.push_back(std::move(w));
    }
  }
  return v;
}

TrainState logical_template(const ModelLayout& layout, int stage, int world_rank, int world_size) {
  TrainState t;
  for (int k : layout.stage_params(stage)) {
    const LogicalParam& p = layout.params()[static_cast<size_t>(k)];
    t.params.names.push_back(p.name);
    // Host memory: the file is read into it, then each rank copies its slice in (to its device).
    t.params.values.push_back(ops::Tensor::host(p.logical_shape, ops::DType::F32, ops::Account::Workspace));
    t.params.decay.push_back(p.desc.decay);
  }
  t.world_rank = world_rank;
  t.world_size = world_size;
  return t;
}

void load_local_from_logical(const ModelLayout& layout, int stage, int64_t tp_rank, const TrainState& logical,
                             TrainState& local) {
  ParamSet& ps = local.params;
  const bool moments = !logical.adam_m.empty();
  if (moments && local.adam_m.size() != ps.values.size()) {
    local.adam_m.clear();
    local.adam_v.clear();
    for (size_t i = 0; i < ps.values.size(); ++i) {
      ops::Backend* dev = ps.values[i].device();  // beside the values
      local.adam_m.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer, true, dev);
      local.adam_v.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer, true, dev);
    }
  }
  std::vector<float> tmp_src;  // a logical tensor copied out, when it is not host memory
  for (auto [i, p] : held(layout, stage, ps)) {
    const ops::TensorDesc d = p->shard(tp_rank);
    const int j = logical.params.index(p->name);
    RUNNER_CHECK(j >= 0, "parameter " + p->name + " missing when loading the logical state");
    // The stored fp32 weights become the masters (this rank's piece) and the values: the same
    // fp32 numbers, or their rounding to the compute format (values == round(masters)).
    auto [a, e] = ps.owned_range(i);
    std::vector<float> tmp(static_cast<size_t>(numel(d.shape)));
    ops::Tensor& val = ps.values[i];
    logical_to_shard(*p, d, host_f32(logical.params.values[static_cast<size_t>(j)], tmp_src), tmp.data());
    if (val.dtype() == ops::DType::F32) {
      copy_in_range(val, 0, tmp.data(), val.nbytes());  // the crossing in: a copy_in on a device
    } else {
      std::vector<uint16_t> v16(static_cast<size_t>(val.numel()));
      ops::from_f32(v16.data(), val.dtype(), tmp.data(), val.numel());
      copy_in_range(val, 0, v16.data(), val.nbytes());
      if (!local.masters.empty() && e > a)
        copy_in_range(local.masters[i], 0, tmp.data() + a, static_cast<size_t>(e - a) * sizeof(float));
    }
    if (!moments) continue;
    for (int which = 0; which < 2; ++which) {
      const ops::Tensor& src = (which == 0 ? logical.adam_m : logical.adam_v)[static_cast<size_t>(j)];
      ops::Tensor& dst = (which == 0 ? local.adam_m : local.adam_v)[i];
      logical_to_shard(*p, d, host_f32(src, tmp_src), tmp.data());
      if (e > a) copy_in_range(dst, 0, tmp.data() + a, static_cast<size_t>(e - a) * sizeof(float));
    }
  }
  // copy_in reads its host buffer before it returns, so `tmp` may go; the device copies are
  // queued ahead of the first step's kernels.
  local.copy_scalars_from(logical);
  local.recipe_yaml = logical.recipe_yaml;
}

}  // namespace runner
