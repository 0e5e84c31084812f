// In-memory copies of the training state: clone_state (a deep copy on the state's own device)
// and the memory snapshot tier (rollback without touching disk). The snapshot lives in host
// memory whatever the device: taking it stages the tensors out (Backend::stage_out on the
// device's side queue, waited for only when the snapshot is next used, so training does not
// wait for the copy), restoring it copies them back in (copy_in). Host tensors (the plain CPU
// device) are copied in host memory, spread over the idle OpenMP pool, as before.
#include <algorithm>
#include <cstring>

#include "ops/backend.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/staging.h"
#include "runner/errors.h"

namespace runner {

namespace {

// A deep copy on `t`'s own device (host: the pool copy; a device: a queued device copy).
ops::Tensor deep_copy(const ops::Tensor& t, ops::Account a) {
  if (!t.defined()) return {};
  if (!t.on_host()) return t.clone(a);
  ops::Tensor c(t.shape(), t.dtype(), a, /*zero=*/false, t.device());
  host_copy(c.host_raw(), t.host_raw(), t.nbytes());
  return c;
}

void check_same(const ops::Tensor& dst, const ops::Tensor& src, const std::string& what) {
  RUNNER_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
               what + ": shape " + src.shape_str() + " does not match " + dst.shape_str());
}

bool same_layout(const std::vector<ops::Tensor>& a, const std::vector<ops::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return false;
  return true;
}

std::vector<ops::Tensor> host_like(const std::vector<ops::Tensor>& ts) {
  std::vector<ops::Tensor> out;
  for (auto& t : ts) out.push_back(ops::Tensor::host(t.shape(), t.dtype(), ops::Account::Workspace, /*zero=*/false));
  return out;
}

}  // namespace

TrainState clone_state(const TrainState& s, ops::Account account) {
  TrainState c;
  copy_state_meta(c, s);
  for (auto& t : s.params.values) c.params.values.push_back(deep_copy(t, account));
  for (auto& t : s.adam_m) c.adam_m.push_back(deep_copy(t, account));
  for (auto& t : s.adam_v) c.adam_v.push_back(deep_copy(t, account));
  for (auto& t : s.masters) c.masters.push_back(deep_copy(t, account));
  return c;
}

// ---------------------------------------------------------------------------------------
// MemorySnapshot

// src -> the snapshot's host copy: a host copy, or a copy out of the device left in flight.
void MemorySnapshot::stage(ops::Tensor& dst, const ops::Tensor& src) {
  check_same(dst, src, "snapshot");
  if (!src.nbytes()) return;
  if (src.on_host()) {
    host_copy(dst.host_raw(), src.host_raw(), src.nbytes());
    return;
  }
  src.device()->stage_out(dst.host_raw(), src.raw(), src.nbytes());
  pending_device_ = src.device();
}

void MemorySnapshot::settle() const {
  if (!pending_device_) return;
  ops::Backend* d = pending_device_;
  pending_device_ = nullptr;
  d->stage_wait(pending_fence_);
}

void MemorySnapshot::take(const TrainState& s) {
  settle();  // an earlier snapshot's copies land before its buffers are written again
  bool reuse = valid_ && same_layout(state_.params.values, s.params.values) && same_layout(state_.adam_m, s.adam_m) &&
               same_layout(state_.adam_v, s.adam_v) && same_layout(state_.masters, s.masters);
  if (!reuse) {
    state_ = TrainState{};
    state_.recipe_yaml = s.recipe_yaml;
    state_.world_rank = s.world_rank;
    state_.world_size = s.world_size;
    state_.params.names = s.params.names;
    state_.params.decay = s.params.decay;
    state_.params.values = host_like(s.params.values);
    state_.adam_m = host_like(s.adam_m);
    state_.adam_v = host_like(s.adam_v);
    state_.masters = host_like(s.masters);
  }
  for (size_t i = 0; i < s.params.values.size(); ++i) stage(state_.params.values[i], s.params.values[i]);
  for (size_t i = 0; i < s.adam_m.size(); ++i) stage(state_.adam_m[i], s.adam_m[i]);
  for (size_t i = 0; i < s.adam_v.size(); ++i) stage(state_.adam_v[i], s.adam_v[i]);
  for (size_t i = 0; i < s.masters.size(); ++i) stage(state_.masters[i], s.masters[i]);
  if (pending_device_) pending_fence_ = pending_device_->stage_fence();
  state_.copy_scalars_from(s);
  valid_ = true;
}

void MemorySnapshot::restore(TrainState& s) const {
  RUNNER_CHECK(valid_, "restore from an empty memory snapshot");
  RUNNER_CHECK(s.params.values.size() == state_.params.values.size(), "snapshot and state hold different parameter sets");
  settle();
  auto put = [](ops::Tensor& dst, const ops::Tensor& src, const std::string& what) {
    check_same(dst, src, what);
    if (dst.on_host()) host_copy(dst.host_raw(), src.host_raw(), src.nbytes());
    else copy_in_range(dst, 0, src.host_raw(), src.nbytes());  // the crossing back in
  };
  for (size_t i = 0; i < state_.params.values.size(); ++i)
    put(s.params.values[i], state_.params.values[i], "restore " + state_.params.names[i]);
  if (s.adam_m.empty() && !state_.adam_m.empty()) {
    ops::Backend* dev = s.params.values.empty() ? nullptr : s.params.values[0].device();  // beside the values
    for (int which = 0; which < 2; ++which) {
      for (auto& t : which == 0 ? state_.adam_m : state_.adam_v) {
        ops::Tensor c(t.shape(), t.dtype(), ops::Account::Optimizer, /*zero=*/false, dev);
        put(c, t, "restore moments");
        (which == 0 ? s.adam_m : s.adam_v).push_back(std::move(c));
      }
    }
  } else {
    RUNNER_CHECK(s.adam_m.size() == state_.adam_m.size() && s.adam_v.size() == state_.adam_v.size(),
                 "snapshot and state hold different optimizer moments");
    for (size_t i = 0; i < state_.adam_m.size(); ++i) put(s.adam_m[i], state_.adam_m[i], "restore adam_m");
    for (size_t i = 0; i < state_.adam_v.size(); ++i) put(s.adam_v[i], state_.adam_v[i], "restore adam_v");
  }
  RUNNER_CHECK(s.masters.size() == state_.masters.size(), "snapshot and state hold different master weights");
  for (size_t i = 0; i < state_.masters.size(); ++i) put(s.masters[i], state_.masters[i], "restore masters");
  s.copy_scalars_from(state_);
}

size_t MemorySnapshot::bytes() const {
  size_t n = 0;
  for (auto& t : state_.params.values) n += t.nbytes();
  for (auto& t : state_.adam_m) n += t.nbytes();
  for (auto& t : state_.adam_v) n += t.nbytes();
  for (auto& t : state_.masters) n += t.nbytes();
  return n;
}

void MemorySnapshot::clear() {
  settle();
  state_ = TrainState{};
  valid_ = false;
}

}  // namespace runner
