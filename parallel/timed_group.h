// A reduction group that times its calls: the tensor-parallel collectives an executor makes
// inside its forward and backward passes, so the step-time breakdown can move them from
// compute to communication (runner/observe/metrics.h). Cumulative; readers take differences.
#pragma once
#include <chrono>

#include "ops/group.h"

namespace parallel {

class TimedGroup : public ops::ReduceGroup {
 public:
  explicit TimedGroup(ops::ReduceGroup& g) : g_(g) {}
  int rank() const override { return g_.rank(); }
  int size() const override { return g_.size(); }
  void allreduce_sum(float* x, int64_t n) override { timed([&] { g_.allreduce_sum(x, n); }); }
  void allreduce_max(float* x, int64_t n) override { timed([&] { g_.allreduce_max(x, n); }); }
  void allgather(const float* in, float* out, int64_t n) override { timed([&] { g_.allgather(in, out, n); }); }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    timed([&] { g_.reduce_scatter_sum(in, out, n); });
  }
  // Milliseconds spent in the group's calls so far (and in others added with add()).
  const double* ms() const { return &ms_; }
  double total_ms() const { return ms_; }
  void add(double ms) { ms_ += ms; }
  int64_t calls() const { return calls_; }

 private:
  template <class F>
  void timed(F&& f) {
    auto t = std::chrono::steady_clock::now();
    f();
    ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    calls_++;
  }
  ops::ReduceGroup& g_;
  double ms_ = 0;
  int64_t calls_ = 0;
};

}  // namespace parallel
