// Communicators: the collectives and point-to-point messages that ranks exchange.
//
// `Communicator` is the interface the rest of the runner programs against; MpiComm implements
// it over an MPI communicator (CPU), and a NCCL implementation will slot in for GPUs with the
// same calls. SelfComm is the one-rank communicator (no MPI needed), so single-rank training
// runs the same code path with every collective a no-op.
//
// Conventions: counts are elements; every call is in place unless it names an output; all
// members of the communicator must make the same collective calls in the same order (MPI's
// rule). Results of reductions are bit-identical on every member. Counts above INT_MAX are
// split internally.
//
// Host memory and tensor memory. A Communicator's own calls take HOST memory:
// scalars, metrics, counters, checkpoint staging buffers. Tensor memory (gradient buckets,
// the tensor-parallel collectives of the executor, pipeline activations) goes through its
// tensors() face, which takes pointers into the run's device memory: the device is set once
// for the whole grid from the run's backend (Grid, set_device), never guessed per pointer. On
// a host-memory device (the CPU) tensors() calls the host calls directly; on a device whose
// memory the host cannot touch (cpu-strict, a GPU without NCCL or with ranks sharing one GPU)
// it stages: the device's queue is drained, the bytes are copied out to a reused host
// staging buffer, the host call runs on it, and the result is copied back in; the NCCL
// communicator (parallel/cuda/gpu_comm.h) runs them on the GPU.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/group.h"
#include "ops/tensor.h"
#include "ops/trace.h"

namespace parallel {

// The calls a communicator makes, by kind, for counting and for trace events' names.
enum class CommOp : int {
  Allreduce, Iallreduce, IreduceScatter, Iallgather, Allgather, Broadcast, Send, Recv, Isend, Irecv, Barrier, Count
};
constexpr int kCommOps = static_cast<int>(CommOp::Count);
const char* comm_op_name(CommOp op);  // "allreduce", "iallreduce", "ireduce_scatter", ...
bool comm_op_p2p(CommOp op);          // send, recv, isend, irecv
using CommCounts = std::array<int64_t, kCommOps>;

// A non-blocking operation in flight. Destroying an unfinished request waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;  // true once complete (drives progress; cheap)
  virtual void wait() = 0;
};

// Collectives and messages over tensor memory: pointers into tensors of the communicator's
// device (Communicator::tensors()). The same contracts as the Communicator's host calls of the
// same names. As an ops::ReduceGroup it is the group a tensor-parallel executor is given.
class TensorComm : public ops::ReduceGroup {
 public:
  // ops::ReduceGroup: rank(), size(), allreduce_sum/max(float*), allgather, reduce_scatter_sum.
  virtual std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) = 0;
  virtual std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) = 0;
  virtual std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) = 0;
  virtual void send(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual void recv(void* buf, size_t bytes, int src, int tag) = 0;
  virtual std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) = 0;
  // Whether the calls go through host staging buffers, and the most bytes those buffers held
  // at once (host memory, not the device's: outside the ledger's accounts, like MPI's own buffers).
  virtual bool staged() const { return false; }
  virtual size_t staging_peak_bytes() const { return 0; }
};

class Communicator : public ops::ReduceGroup {
 public:
  Communicator();
  ~Communicator() override;
  // ops::ReduceGroup: rank(), size(), allreduce_sum(float*), allreduce_max(float*).
  virtual void allreduce_sum(double* x, int64_t n) = 0;
  virtual void allreduce_sum(int64_t* x, int64_t n) = 0;
  virtual void allreduce_min(int64_t* x, int64_t n) = 0;
  virtual void allreduce_max(int64_t* x, int64_t n) = 0;
  using ops::ReduceGroup::allreduce_sum;
  using ops::ReduceGroup::allreduce_max;
  // ops::ReduceGroup's gather and scatter, through the calls below.
  void allgather(const float* in, float* out, int64_t n) override;
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override;
  // The gradient and parameter collectives take the buffer's dtype: F32, or BF16 / F16 (16-bit
  // storage, summed in fp32 and rounded to nearest even after each addition, so a 16-bit sum
  // over ranks depends on MPI's reduction order as any 16-bit accumulation does).
  // Non-blocking in-place sum (also F64).
  virtual std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) = 0;
  // in: size()*n elements (rank r's block is in[r*n, (r+1)*n)); out: n elements = sum over
  // ranks of their block `rank()`. out must not overlap in.
  virtual std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) = 0;
  // buf: size()*n elements; this rank's block buf[rank()*n, (rank()+1)*n) is sent to all, and
  // every other block is received in place.
  virtual std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) = 0;
  virtual void allgather_inplace(float* buf, int64_t n) = 0;
  // fp32 forms.
  std::unique_ptr<Request> iallreduce_sum(float* x, int64_t n) { return iallreduce_sum(x, ops::DType::F32, n); }
  std::unique_ptr<Request> ireduce_scatter_sum(const float* in, float* out, int64_t n) {
    return ireduce_scatter_sum(in, out, ops::DType::F32, n);
  }
  std::unique_ptr<Request> iallgather_inplace(float* buf, int64_t n) { return iallgather_inplace(buf, ops::DType::F32, n); }
  // Raw bytes.
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void send(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual void recv(void* buf, size_t bytes, int src, int tag) = 0;
  virtual std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) = 0;
  virtual void barrier() = 0;
  // Stops every process of the job (MPI_Abort on the world); never returns.
  [[noreturn]] virtual void abort(int code) = 0;
  // Splits into sub-communicators: members with the same color form one, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // The device whose memory tensors() takes: the run's backend, set once before the first
  // tensor call (the Grid does it for all its communicators); split() passes it on. Null (the
  // default) or a host-memory backend: tensors() is the host calls themselves.
  void set_device(ops::Backend* device);
  ops::Backend* device() const { return device_; }
  // The tensor-memory face of this communicator (see the top of this file).
  virtual TensorComm& tensors();

  // What this communicator is called in traces and counts ("dp", "tp", "world", ...).
  void set_name(const char* name) { name_ = name; }
  const char* name() const { return name_; }
  // Every call from now on is reported to `sink` as a span (a non-blocking one when it is seen
  // complete, with its time in wait() as exposed); null (the default): nothing is recorded.
  // The one-rank communicator does nothing and reports nothing.
  void set_trace(ops::TraceSink* sink) { trace_ = sink; }
  // The calls made so far, per kind (always counted, traced or not; cumulative).
  const CommCounts& counts() const { return counts_; }

 protected:
  ops::Backend* device_ = nullptr;
  std::unique_ptr<TensorComm> tensors_;  // made on first use for device_
  ops::TraceSink* trace_ = nullptr;
  const char* name_ = "";
  CommCounts counts_{};
};

// The one-rank communicator: reductions and gathers are no-ops, point-to-point throws.
std::unique_ptr<Communicator> self_comm();

// MPI. init_mpi() initialises MPI (MPI_THREAD_FUNNELED, or higher if offered) once per process;
// mpi_launched() says whether the environment looks like mpirun/srun started us (Open MPI,
// PMI/PMIx or Slurm variables), so a plain `runner train` never touches MPI.
bool mpi_launched();
// init_mpi also makes MPI return errors instead of aborting the process (MPI_ERRORS_RETURN on
// the world, inherited by every communicator split from it), so that a peer's death reaches
// the failure handler below, which can name the rank that is gone.
void init_mpi(int* argc, char*** argv);
// Called with "MPI_Allreduce failed: ..." when an MPI call returns an error, before the call
// throws; it is expected not to return (a rank blocked in a collective cannot unwind through
// requests still in flight). nullptr: the call throws std::runtime_error.
using CommFailureHandler = void (*)(const std::string& what);
void set_comm_failure_handler(CommFailureHandler h);
bool mpi_initialized();
void finalize_mpi();
// The world communicator (init_mpi first).
std::unique_ptr<Communicator> mpi_world();
// The MPI communicator behind `c`, as a pointer to its MPI_Comm (valid while `c` lives), for
// libraries that take one (parallel HDF5's H5Pset_fapl_mpio); nullptr when `c` is not an MPI
// communicator (SelfComm).
void* mpi_handle(Communicator& c);

}  // namespace parallel
