// In-memory copies of the training state: clone_state (what an asynchronous save copies at the
// step boundary, the only time it blocks training) and the memory snapshot tier (rollback
// without touching disk). Both are a memory-bandwidth-bound copy, spread over the idle OpenMP
// pool at a step boundary.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"

namespace runner {

namespace {

// memcpy in 4 MiB pieces over the OpenMP pool: a snapshot is memory-bandwidth bound and one
// core cannot saturate it; the pool is idle at a step boundary. Up to 8 threads (bandwidth
// saturates there), and none on small machines, where measured on 2 shared cores the fork-join
// made the copy 3x slower than one memcpy.
void parallel_copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = 4u << 20;
  const int threads = std::min(8, omp_get_max_threads());
  if (n < 2 * kPiece || threads < 4) {
    std::memcpy(dst, src, n);
    return;
  }
  const int64_t pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < pieces; ++i) {
    size_t off = static_cast<size_t>(i) * kPiece;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(kPiece, n - off));
  }
}

ops::Tensor deep_copy(const ops::Tensor& t, ops::Account a) {
  if (!t.defined()) return {};
  ops::Tensor c = ops::Tensor::empty(t.shape(), t.dtype(), a);
  parallel_copy(c.raw(), t.raw(), t.nbytes());
  return c;
}

void copy_into(ops::Tensor& dst, const ops::Tensor& src, const std::string& what) {
  RUNNER_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
               what + ": shape " + src.shape_str() + " does not match " + dst.shape_str());
  parallel_copy(dst.raw(), src.raw(), src.nbytes());
}

void copy_scalars(TrainState& dst, const TrainState& src) { dst.copy_scalars_from(src); }

bool same_layout(const std::vector<ops::Tensor>& a, const std::vector<ops::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return false;
  return true;
}

}  // namespace

TrainState clone_state(const TrainState& s, ops::Account account) {
  TrainState c;
  copy_scalars(c, s);
  c.recipe_yaml = s.recipe_yaml;
  c.world_rank = s.world_rank;
  c.world_size = s.world_size;
  c.params.names = s.params.names;
  c.params.decay = s.params.decay;
  for (auto& t : s.params.values) c.params.values.push_back(deep_copy(t, account));
  for (auto& t : s.adam_m) c.adam_m.push_back(deep_copy(t, account));
  for (auto& t : s.adam_v) c.adam_v.push_back(deep_copy(t, account));
  for (auto& t : s.masters) c.masters.push_back(deep_copy(t, account));
  return c;
}

// ---------------------------------------------------------------------------------------
// MemorySnapshot

void MemorySnapshot::take(const TrainState& s) {
  bool reuse = valid_ && same_layout(state_.params.values, s.params.values) && same_layout(state_.adam_m, s.adam_m) &&
               same_layout(state_.adam_v, s.adam_v) && same_layout(state_.masters, s.masters);
  if (!reuse) {
    state_ = clone_state(s, ops::Account::Workspace);
  } else {
    for (size_t i = 0; i < s.params.values.size(); ++i) copy_into(state_.params.values[i], s.params.values[i], "snapshot");
    for (size_t i = 0; i < s.adam_m.size(); ++i) copy_into(state_.adam_m[i], s.adam_m[i], "snapshot");
    for (size_t i = 0; i < s.adam_v.size(); ++i) copy_into(state_.adam_v[i], s.adam_v[i], "snapshot");
    for (size_t i = 0; i < s.masters.size(); ++i) copy_into(state_.masters[i], s.masters[i], "snapshot");
    copy_scalars(state_, s);
  }
  valid_ = true;
}

void MemorySnapshot::restore(TrainState& s) const {
  RUNNER_CHECK(valid_, "restore from an empty memory snapshot");
  RUNNER_CHECK(s.params.values.size() == state_.params.values.size(), "snapshot and state hold different parameter sets");
  for (size_t i = 0; i < state_.params.values.size(); ++i)
    copy_into(s.params.values[i], state_.params.values[i], "restore " + state_.params.names[i]);
  if (s.adam_m.empty() && !state_.adam_m.empty()) {
    for (auto& t : state_.adam_m) s.adam_m.push_back(deep_copy(t, ops::Account::Optimizer));
    for (auto& t : state_.adam_v) s.adam_v.push_back(deep_copy(t, ops::Account::Optimizer));
  } else {
    RUNNER_CHECK(s.adam_m.size() == state_.adam_m.size() && s.adam_v.size() == state_.adam_v.size(),
                 "snapshot and state hold different optimizer moments");
    for (size_t i = 0; i < state_.adam_m.size(); ++i) copy_into(s.adam_m[i], state_.adam_m[i], "restore adam_m");
    for (size_t i = 0; i < state_.adam_v.size(); ++i) copy_into(s.adam_v[i], state_.adam_v[i], "restore adam_v");
  }
  RUNNER_CHECK(s.masters.size() == state_.masters.size(), "snapshot and state hold different master weights");
  for (size_t i = 0; i < state_.masters.size(); ++i) copy_into(s.masters[i], state_.masters[i], "restore masters");
  copy_scalars(s, state_);
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
  state_ = TrainState{};
  valid_ = false;
}

}  // namespace runner
