// A reduction group as the executor sees it: the tensor-parallel ranks that together hold
// one layer's shards. ops/ knows nothing of MPI or ranks' places in a grid; parallel/
// implements this interface with a communicator (MPI on CPU, NCCL on GPU) and hands it to
// the executor of a tensor-parallel graph.
#pragma once
#include <cstdint>
#include <cstring>

namespace ops {

class ReduceGroup {
 public:
  virtual ~ReduceGroup() = default;
  virtual int rank() const = 0;   // 0 .. size()-1
  virtual int size() const = 0;
  // In place, blocking; every member receives bit-identical results.
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  virtual void allreduce_max(float* x, int64_t n) = 0;
  // Sequence parallelism. in: n elements per rank; out: size()*n, rank r's block at r*n.
  virtual void allgather(const float* in, float* out, int64_t n) = 0;
  // in: size()*n; out: n = the sum over ranks of their block rank().
  virtual void reduce_scatter_sum(const float* in, float* out, int64_t n) = 0;
};

// The group of one rank: every collective is the identity. For a graph run without tensor
// parallelism that still wants a group (calibration's single-node graphs, the operator tests).
class SoloGroup final : public ReduceGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_max(float*, int64_t) override {}
  void allgather(const float* in, float* out, int64_t n) override { copy(in, out, n); }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override { copy(in, out, n); }

 private:
  static void copy(const float* in, float* out, int64_t n) {
    if (in != out && n > 0) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  }
};

}  // namespace ops
