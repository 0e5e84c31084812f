// A reduction group as the executor sees it: the tensor-parallel ranks that together hold
// one layer's shards. ops/ knows nothing of MPI or ranks' places in a grid; parallel/
// implements this interface with a communicator (MPI on CPU, NCCL on GPU) and hands it to
// the executor of a tensor-parallel graph.
#pragma once
#include <cstdint>

namespace ops {

class ReduceGroup {
 public:
  virtual ~ReduceGroup() = default;
  virtual int rank() const = 0;   // 0 .. size()-1
  virtual int size() const = 0;
  // In place, blocking; every member receives bit-identical results.
  virtual void allreduce_sum(float* x, int64_t n) = 0;
  virtual void allreduce_max(float* x, int64_t n) = 0;
};

}  // namespace ops
