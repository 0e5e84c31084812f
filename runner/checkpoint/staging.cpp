// Staging the training state out of the device and back in (staging.h).
#include "runner/checkpoint/staging.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "ops/backend.h"

namespace runner {

namespace {

std::mutex g_pool_mu;
std::map<ops::Backend*, std::multimap<size_t, void*>> g_pool;  // free pinned blocks

}  // namespace

void* staging_alloc(ops::Backend& device, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    auto& free = g_pool[&device];
    auto it = free.find(bytes);
    if (it != free.end()) {
      void* p = it->second;
      free.erase(it);
      return p;
    }
  }
  return device.alloc_pinned(bytes);
}

void staging_free(ops::Backend& device, void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool[&device].emplace(bytes, p);
}

// memcpy in 4 MiB pieces over the OpenMP pool: a snapshot is memory-bandwidth bound and one
// core cannot saturate it; the pool is idle at a step boundary. Up to 8 threads (bandwidth
// saturates there), and none on small machines, where measured on 2 shared cores the fork-join
// made the copy 3x slower than one memcpy.
void host_copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = 4u << 20;
  const int threads = std::min(8, omp_get_max_threads());
  if (n < 2 * kPiece || threads < 4) {
    if (n) std::memcpy(dst, src, n);
    return;
  }
  const int64_t pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < pieces; ++i) {
    size_t off = static_cast<size_t>(i) * kPiece;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(kPiece, n - off));
  }
}

void copy_in_range(ops::Tensor& dst, size_t byte_offset, const void* src, size_t bytes) {
  if (!bytes) return;
  char* p = static_cast<char*>(dst.raw()) + byte_offset;  // a device address: only passed on
  if (dst.on_host()) std::memcpy(p, src, bytes);
  else dst.device()->copy_in(p, src, bytes);
}

const void* host_bytes(const ops::Tensor& t, std::vector<char>& buf) {
  if (t.on_host()) return t.host_raw();
  buf.resize(t.nbytes());
  t.read_to_host(buf.data());
  return buf.data();
}

void copy_state_meta(TrainState& to, const TrainState& from) {
  to.copy_scalars_from(from);
  to.recipe_yaml = from.recipe_yaml;
  to.world_rank = from.world_rank;
  to.world_size = from.world_size;
  to.params.names = from.params.names;
  to.params.decay = from.params.decay;
}

StagedState::StagedState(const TrainState& s, bool copy) {
  copy_state_meta(meta_, s);
  for (const ops::Tensor& t : s.params.values) params_.push_back(stage(t, copy));
  for (const ops::Tensor& t : s.adam_m) m_.push_back(stage(t, copy));
  for (const ops::Tensor& t : s.adam_v) v_.push_back(stage(t, copy));
  // One fence per device after its copies: the writer waits for the copies, not for training.
  std::vector<ops::Backend*> devices;
  for (const Pinned& p : pinned_)
    if (std::find(devices.begin(), devices.end(), p.device) == devices.end()) devices.push_back(p.device);
  for (ops::Backend* d : devices) fences_.emplace_back(d, d->stage_fence());
}

StagedTensor StagedState::stage(const ops::Tensor& t, bool copy) {
  StagedTensor st{t.shape(), t.dtype(), nullptr};
  if (!t.defined() || t.nbytes() == 0) return st;
  if (t.on_host()) {
    if (!copy) {
      st.data = t.host_raw();
      return st;
    }
    ops::Tensor c = ops::Tensor::host(t.shape(), t.dtype(), ops::Account::Workspace, /*zero=*/false);
    host_copy(c.host_raw(), t.host_raw(), t.nbytes());
    st.data = c.host_raw();
    host_copies_.push_back(std::move(c));
    return st;
  }
  ops::Backend& d = *t.device();
  void* p = staging_alloc(d, t.nbytes());
  pinned_.push_back({&d, p, t.nbytes()});
  d.stage_out(p, t.raw(), t.nbytes());
  device_bytes_ += t.nbytes();
  st.data = p;
  return st;
}

void StagedState::wait() {
  // Each fence is waited for once; later calls find none left.
  std::vector<std::pair<ops::Backend*, uint64_t>> fences;
  fences.swap(fences_);
  for (auto [d, f] : fences) d->stage_wait(f);
}

StagedState::~StagedState() {
  try {
    wait();  // a buffer goes back to the pool only once nothing copies into it
  } catch (...) {
  }
  for (const Pinned& p : pinned_) staging_free(*p.device, p.p, p.bytes);
}

}  // namespace runner
