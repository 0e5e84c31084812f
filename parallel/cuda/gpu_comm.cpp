// NCCL and host-staged communicators (gpu_comm.h).
#include "parallel/cuda/gpu_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cuda/cuda_backend.h"

namespace parallel {
namespace {

void cu_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("gpu_comm: ") + what + ": " + cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("gpu_comm: ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(ops::DType t) {
  switch (t) {
    case ops::DType::F32: return ncclFloat32;
    case ops::DType::BF16: return ncclBfloat16;
    case ops::DType::F16: return ncclFloat16;
    default: throw std::invalid_argument(std::string("gpu_comm: no collective for dtype ") + ops::dtype_name(t));
  }
}

cudaStream_t compute() { return static_cast<cudaStream_t>(ops::cuda::compute_stream()); }

// Complete when its event has passed on the communication stream.
class EventRequest final : public Request {
 public:
  explicit EventRequest(cudaStream_t s) {
    cu_check(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming), "cudaEventCreate");
    cu_check(cudaEventRecord(ev_, s), "cudaEventRecord");
  }
  ~EventRequest() override {
    if (ev_) {
      cudaEventSynchronize(ev_);
      cudaEventDestroy(ev_);
    }
  }
  bool test() override { return cudaEventQuery(ev_) == cudaSuccess; }
  void wait() override { cu_check(cudaEventSynchronize(ev_), "cudaEventSynchronize"); }

 private:
  cudaEvent_t ev_ = nullptr;
};
class DoneRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class NcclComm final : public Communicator {
 public:
  NcclComm(std::unique_ptr<Communicator> boot, ncclComm_t comm) : boot_(std::move(boot)), comm_(comm) {
    cu_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cu_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~NcclComm() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }

  void allreduce_sum(float* x, int64_t n) override { iallreduce_sum(x, ops::DType::F32, n)->wait(); }
  void allreduce_max(float* x, int64_t n) override {
    after_compute();
    nccl_check(ncclAllReduce(x, x, n, ncclFloat32, ncclMax, comm_, stream_), "ncclAllReduce(max)");
    cu_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void allreduce_sum(double* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { boot_->allreduce_min(x, n); }
  void allreduce_max(int64_t* x, int64_t n) override { boot_->allreduce_max(x, n); }

  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override {
    after_compute();
    nccl_check(ncclAllReduce(x, x, n, nccl_type(t), ncclSum, comm_, stream_), "ncclAllReduce");
    return std::make_unique<EventRequest>(stream_);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    after_compute();
    nccl_check(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, comm_, stream_), "ncclReduceScatter");
    return std::make_unique<EventRequest>(stream_);
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    after_compute();
    const char* mine = static_cast<const char*>(buf) + static_cast<size_t>(rank()) * n * ops::dtype_size(t);
    nccl_check(ncclAllGather(mine, buf, n, nccl_type(t), comm_, stream_), "ncclAllGather");  // in-place form
    return std::make_unique<EventRequest>(stream_);
  }
  void allgather_inplace(float* buf, int64_t n) override { iallgather_inplace(buf, ops::DType::F32, n)->wait(); }

  void broadcast(void* buf, size_t bytes, int root) override { boot_->broadcast(buf, bytes, root); }
  void send(const void* buf, size_t bytes, int dst, int tag) override { isend(buf, bytes, dst, tag)->wait(); }
  void recv(void* buf, size_t bytes, int src, int tag) override { irecv(buf, bytes, src, tag)->wait(); }
  // NCCL has no tags: messages between a pair arrive in the order they were posted, which is
  // the order the pipeline schedules post them on every rank.
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int) override {
    after_compute();
    nccl_check(ncclSend(buf, bytes, ncclUint8, dst, comm_, stream_), "ncclSend");
    return std::make_unique<EventRequest>(stream_);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int) override {
    after_compute();
    nccl_check(ncclRecv(buf, bytes, ncclUint8, src, comm_, stream_), "ncclRecv");
    return std::make_unique<EventRequest>(stream_);
  }
  void barrier() override { boot_->barrier(); }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    boot_->abort(code);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> sub_boot = boot_->split(color, key);
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_unique<NcclComm>(std::move(sub_boot), sub);
  }

 private:
  std::unique_ptr<Communicator> boot_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  // The communication stream waits for everything enqueued on the compute stream so far.
  void after_compute() {
    cu_check(cudaEventRecord(ready_, compute()), "cudaEventRecord");
    cu_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }
};

// Device buffers through host memory and the bootstrap's collectives; every call completes
// before it returns (the Requests it hands out are done).
class HostStagedComm final : public Communicator {
 public:
  explicit HostStagedComm(std::unique_ptr<Communicator> boot) : boot_(std::move(boot)) {}
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }

  void allreduce_sum(float* x, int64_t n) override { iallreduce_sum(x, ops::DType::F32, n); }
  void allreduce_max(float* x, int64_t n) override {
    float* h = static_cast<float*>(stage_in(x, n * sizeof(float)));
    boot_->allreduce_max(h, n);
    stage_out(x, n * sizeof(float));
  }
  void allreduce_sum(double* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { boot_->allreduce_min(x, n); }
  void allreduce_max(int64_t* x, int64_t n) override { boot_->allreduce_max(x, n); }

  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override {
    void* h = stage_in(x, n * ops::dtype_size(t));
    boot_->iallreduce_sum(h, t, n)->wait();
    stage_out(x, n * ops::dtype_size(t));
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    const size_t blk = n * ops::dtype_size(t);
    char* h = static_cast<char*>(stage_in(in, blk * size() + blk));  // [in | out]
    boot_->ireduce_scatter_sum(h, h + blk * size(), t, n)->wait();
    ops::cuda::copy_to_device(out, h + blk * size(), blk);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    const size_t bytes = n * ops::dtype_size(t) * size();
    void* h = stage_in(buf, bytes);
    boot_->iallgather_inplace(h, t, n)->wait();
    stage_out(buf, bytes);
    return std::make_unique<DoneRequest>();
  }
  void allgather_inplace(float* buf, int64_t n) override { iallgather_inplace(buf, ops::DType::F32, n); }

  void broadcast(void* buf, size_t bytes, int root) override { boot_->broadcast(buf, bytes, root); }
  void send(const void* buf, size_t bytes, int dst, int tag) override {
    void* h = stage_in(buf, bytes);
    boot_->send(h, bytes, dst, tag);
  }
  void recv(void* buf, size_t bytes, int src, int tag) override {
    grow(bytes);
    boot_->recv(host_.data(), bytes, src, tag);
    stage_out(buf, bytes);
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) override {
    send(buf, bytes, dst, tag);
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) override {
    recv(buf, bytes, src, tag);
    return std::make_unique<DoneRequest>();
  }
  void barrier() override { boot_->barrier(); }
  [[noreturn]] void abort(int code) override { boot_->abort(code); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<HostStagedComm>(boot_->split(color, key));
  }

 private:
  std::unique_ptr<Communicator> boot_;
  std::vector<char> host_;
  void grow(size_t bytes) {
    if (host_.size() < bytes) host_.resize(bytes);
  }
  // Device -> host staging buffer (after the compute stream's earlier work).
  void* stage_in(const void* dev, size_t bytes) {
    grow(bytes);
    ops::cuda::copy_to_host(host_.data(), dev, bytes);
    return host_.data();
  }
  void stage_out(void* dev, size_t bytes) { ops::cuda::copy_to_device(dev, host_.data(), bytes); }
};

}  // namespace

std::unique_ptr<Communicator> nccl_comm(std::unique_ptr<Communicator> bootstrap) {
  std::string why;
  if (!ops::cuda::device_available(&why)) throw std::runtime_error("nccl_comm: no CUDA device: " + why);
  ops::cuda::cuda_backend();  // the compute stream exists before the first collective
  ncclUniqueId id{};
  if (bootstrap->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  bootstrap->broadcast(&id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank()), "ncclCommInitRank");
  return std::make_unique<NcclComm>(std::move(bootstrap), comm);
}

std::unique_ptr<Communicator> host_staged_comm(std::unique_ptr<Communicator> bootstrap) {
  return std::make_unique<HostStagedComm>(std::move(bootstrap));
}

}  // namespace parallel
