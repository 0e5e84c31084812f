// Staging the training state out of the device and back in: the named crossing between the
// tensors a run trains on (device memory on a GPU or on the strict device, ops/strict/) and the
// host memory a checkpoint is written from and a rollback snapshot is kept in.
//
// Design: nothing in checkpoint/ reads a device tensor. A save builds a StagedState: the copies
// out of every tensor a checkpoint holds are queued on the device's side queue
// (Backend::stage_out, into pinned host buffers on CUDA) and the constructor returns at once;
// whoever reads the bytes (the checkpoint writer, on its own thread for an asynchronous save)
// waits for them first (wait()). Training stalls only for queueing the copies. Host tensors
// (the plain CPU device) are copied in host memory as before, or read in place by a
// synchronous save, so a `cpu` run does exactly what it did. Loading crosses the other way
// with copy_in (copy_in_range).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/tensor.h"
#include "runner/state.h"

namespace runner {

// Everything of `from` but its tensors into `to`: the step-boundary scalars, the recipe, the
// rank, and the parameters' names and decay flags. What a copy, a view or a staging of the
// state starts from before it takes the tensors its own way.
void copy_state_meta(TrainState& to, const TrainState& from);

// One tensor of a staged state: its shape and dtype, and its bytes in host memory once the
// state has been waited for (nullptr: zeros, e.g. moments before the first update).
struct StagedTensor {
  std::vector<int64_t> shape;
  ops::DType dtype = ops::DType::F32;
  const void* data = nullptr;
};

class StagedState {
 public:
  // Stages what a checkpoint of `s` holds: parameter values, Adam moments (when `s` has them)
  // and the scalars. Device tensors are always copied out (queued; see wait()). Host tensors
  // are copied when `copy` (an asynchronous save: training goes on changing them) and read in
  // place otherwise (`s` must then outlive this object).
  StagedState(const TrainState& s, bool copy);
  ~StagedState();
  StagedState(const StagedState&) = delete;
  StagedState& operator=(const StagedState&) = delete;

  // Blocks until every copy out of the device has landed; idempotent, callable from any thread.
  void wait();
  // Scalars, recipe, rank, parameter names and decay flags; no tensors.
  const TrainState& meta() const { return meta_; }
  size_t size() const { return params_.size(); }
  bool has_moments() const { return !m_.empty(); }
  // which: 0 parameter, 1 adam_m, 2 adam_v (TensorRole order).
  const StagedTensor& tensor(int which, size_t i) const { return (which == 0 ? params_ : which == 1 ? m_ : v_)[i]; }
  // Bytes staged out of device memory (pinned buffers) and copied in host memory.
  size_t device_bytes() const { return device_bytes_; }

 private:
  StagedTensor stage(const ops::Tensor& t, bool copy);

  TrainState meta_;
  std::vector<StagedTensor> params_, m_, v_;
  std::vector<ops::Tensor> host_copies_;  // host tensors copied (Workspace account, as before)
  struct Pinned {
    ops::Backend* device;
    void* p;
    size_t bytes;
  };
  std::vector<Pinned> pinned_;
  std::vector<std::pair<ops::Backend*, uint64_t>> fences_;  // to wait for, per device
  size_t device_bytes_ = 0;
};

// A memory-bandwidth-bound host copy, spread over the idle OpenMP pool (a step boundary).
void host_copy(void* dst, const void* src, size_t bytes);

// Host bytes into `dst`'s memory starting `byte_offset` into it: a memcpy for a host tensor, a
// copy_in (queued; `src` reusable on return) for a device tensor.
void copy_in_range(ops::Tensor& dst, size_t byte_offset, const void* src, size_t bytes);
// `t`'s bytes as host memory: t's own pointer for a host tensor, else copied out into `buf`
// (waited for). The pointer is valid while `t` and `buf` are.
const void* host_bytes(const ops::Tensor& t, std::vector<char>& buf);

// Pinned host buffers for staging (Backend::alloc_pinned), cached by size per device so that a
// save every few minutes does not page-lock memory each time (cudaHostAlloc is slow).
void* staging_alloc(ops::Backend& device, size_t bytes);
void staging_free(ops::Backend& device, void* p, size_t bytes);

}  // namespace runner
