// Data-parallel gradient synchronisation: bucketed, overlapped with the backward pass, and
// optionally ZeRO stage 1 (Rajbhandari et al. 2020).
//
// The parameters and gradients of this rank are re-laid out as views into two flat buffers (in
// the values' and the gradients' dtypes: fp32, or 16 bits under bf16/fp16),
// in buckets of about `bucket_bytes` taken in reverse graph order (the order in which backward
// completes them), each bucket padded to a multiple of the data-parallel size. A bucket's
// collective is launched, non-blocking, as soon as every gradient in it is complete (the
// executor's gradient hook), so communication runs behind the rest of the backward pass;
// progress() drives it between operators and finish_grads() waits for what is left, which is
// the exposed part.
//
// Without ZeRO each bucket is all-reduced (summed) in place. With ZeRO-1 each bucket is
// reduce-scattered: rank r receives the summed piece r of every bucket, the optimizer updates
// only those pieces (owned() ranges; the Adam moments exist only for them), and
// gather_params() all-gathers the updated parameters bucket by bucket.
//
// Gradients are summed, not averaged: the loss is already normalised by the global number of
// target tokens, so the sum over ranks is the serial gradient.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ops/tensor.h"
#include "parallel/comm.h"

namespace parallel {

struct GradTensor {
  ops::Tensor* value = nullptr;
  ops::Tensor* grad = nullptr;
  bool excluded = false;  // synchronised by the caller (e.g. a tied embedding across stages): left out of buckets
};

struct SyncStats {
  double hidden_ms = 0;   // communication time overlapped with the backward pass
  double exposed_ms = 0;  // time finish_grads() and gather_params() waited
  int64_t bytes = 0;      // gradient bytes reduced per step
  int buckets = 0;
};

class GradSync {
 public:
  // params: this rank's parameters in graph order. Replaces each value and grad tensor by a view
  // into the flat buffers (values copied). dp may have size 1 (then nothing is communicated).
  GradSync(Communicator& dp, std::vector<GradTensor> params, double bucket_bytes, bool zero1);
  ~GradSync();

  bool zero1() const { return zero1_; }
  // Element range [begin, end) of parameter i that this rank's optimizer updates.
  std::pair<int64_t, int64_t> owned(int i) const { return owned_[static_cast<size_t>(i)]; }
  // Whether parameter i is sharded by ZeRO (false: every dp rank updates all of it).
  bool sharded(int i) const { return zero1_ && !params_[static_cast<size_t>(i)].excluded; }
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  size_t flat_elements() const { return flat_; }

  void start_step();          // before the backward pass whose gradients are final (last micro-batch)
  void grad_ready(int i);     // parameter i's gradient is complete
  void progress();            // tests outstanding collectives (drives MPI progress)
  void finish_grads();        // waits for every bucket; after it the owned gradient ranges are summed
  void gather_params();       // ZeRO-1: all-gathers the updated parameters (no-op otherwise)
  const SyncStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Bucket {
    size_t begin = 0, len = 0;        // element range in the flat buffers (len % dp == 0)
    std::vector<int> params;
    int pending = 0;                   // gradients not yet complete this step
    std::unique_ptr<Request> req;
    Clock::time_point launched, done;
    bool finished = false;
  };
  void launch(Bucket& b);

  Communicator& dp_;
  std::vector<GradTensor> params_;
  bool zero1_;
  ops::DType vtype_ = ops::DType::F32, gtype_ = ops::DType::F32;  // of the values and of the gradients
  size_t flat_ = 0;
  ops::Tensor values_, grads_, recv_;   // flat buffers; recv_: ZeRO pieces (communication account)
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;          // per param, -1 when excluded
  std::vector<std::pair<int64_t, int64_t>> owned_;
  std::vector<size_t> recv_offset_;     // per bucket, offset of its piece in recv_
  SyncStats stats_;
  bool active_ = false;
};

}  // namespace parallel
