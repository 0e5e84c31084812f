// NCCL and host-staged communicators (gpu_comm.h).
#include "parallel/cuda/gpu_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cuda/cuda_backend.h"
#include "ops/knobs.h"

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

// NCCL over tensor memory. The blocking calls order the compute stream after the
// communication stream (an event): the result is there for every kernel queued after them,
// and the host does not wait. The non-blocking ones complete when their event has passed.
// Point-to-point messages (the pipeline's) travel on two further NCCL communicators over the
// same ranks, one per direction (to a higher rank, to a lower rank), each on its own stream:
// NCCL matches messages by order, not by tag, and a send blocks its stream until the peer
// posts the receive, so activations going up and gradients going down must not queue behind
// each other (with one stream, 1F1B deadlocks: stage 0 sends activation 1 while stage 1's
// stream waits to send gradient 0).
class NcclTensors final : public TensorComm {
 public:
  struct Channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };
  NcclTensors(Communicator& host, Channel main, Channel up, Channel down)
      : host_(host), main_(main), up_(up), down_(down) {
    cu_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cu_check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~NcclTensors() override {
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void allreduce_sum(float* x, int64_t n) override { blocking(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, main_.comm, go(main_)), "ncclAllReduce"); }
  void allreduce_max(float* x, int64_t n) override { blocking(ncclAllReduce(x, x, n, ncclFloat32, ncclMax, main_.comm, go(main_)), "ncclAllReduce(max)"); }
  void allgather(const float* in, float* out, int64_t n) override {
    blocking(ncclAllGather(in, out, n, ncclFloat32, main_.comm, go(main_)), "ncclAllGather");
  }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    blocking(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, main_.comm, go(main_)), "ncclReduceScatter");
  }
  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override {
    nccl_check(ncclAllReduce(x, x, n, nccl_type(t), ncclSum, main_.comm, go(main_)), "ncclAllReduce");
    return std::make_unique<EventRequest>(main_.stream);
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    nccl_check(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, main_.comm, go(main_)), "ncclReduceScatter");
    return std::make_unique<EventRequest>(main_.stream);
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    const char* mine = static_cast<const char*>(buf) + static_cast<size_t>(rank()) * n * ops::dtype_size(t);
    nccl_check(ncclAllGather(mine, buf, n, nccl_type(t), main_.comm, go(main_)), "ncclAllGather");  // in-place form
    return std::make_unique<EventRequest>(main_.stream);
  }
  void send(const void* buf, size_t bytes, int dst, int tag) override { isend(buf, bytes, dst, tag)->wait(); }
  void recv(void* buf, size_t bytes, int src, int) override {
    Channel& c = src > rank() ? down_ : up_;
    blocking(c, ncclRecv(buf, bytes, ncclUint8, src, c.comm, go(c)), "ncclRecv");
  }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int) override {
    Channel& c = dst > rank() ? up_ : down_;
    nccl_check(ncclSend(buf, bytes, ncclUint8, dst, c.comm, go(c)), "ncclSend");
    return std::make_unique<EventRequest>(c.stream);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int) override {
    Channel& c = src > rank() ? down_ : up_;
    nccl_check(ncclRecv(buf, bytes, ncclUint8, src, c.comm, go(c)), "ncclRecv");
    return std::make_unique<EventRequest>(c.stream);
  }

 private:
  // The channel's stream waits for everything queued on the compute stream so far.
  cudaStream_t go(const Channel& c) {
    cu_check(cudaEventRecord(ready_, compute()), "cudaEventRecord");
    cu_check(cudaStreamWaitEvent(c.stream, ready_, 0), "cudaStreamWaitEvent");
    return c.stream;
  }
  // The compute stream waits for the call (queued on the channel's stream).
  void blocking(const Channel& c, ncclResult_t r, const char* what) {
    nccl_check(r, what);
    cu_check(cudaEventRecord(done_, c.stream), "cudaEventRecord");
    cu_check(cudaStreamWaitEvent(compute(), done_, 0), "cudaStreamWaitEvent");
  }
  void blocking(ncclResult_t r, const char* what) { blocking(main_, r, what); }
  Communicator& host_;
  Channel main_, up_, down_;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

// Host memory through the bootstrap (MPI) communicator; tensor memory through NCCL.
class NcclComm final : public Communicator {
 public:
  // p2p: also make the two point-to-point channels (the world communicator: the pipeline's).
  NcclComm(std::unique_ptr<Communicator> boot, ncclComm_t comm, bool p2p) : boot_(std::move(boot)) {
    main_ = channel(comm);
    if (p2p) {
      ncclComm_t up = nullptr, down = nullptr;
      nccl_check(ncclCommSplit(comm, 0, rank(), &up, nullptr), "ncclCommSplit");
      nccl_check(ncclCommSplit(comm, 0, rank(), &down, nullptr), "ncclCommSplit");
      up_ = channel(up);
      down_ = channel(down);
    }
    tensors_nccl_ = std::make_unique<NcclTensors>(*this, main_, up_.comm ? up_ : main_, down_.comm ? down_ : main_);
  }
  ~NcclComm() override {
    tensors_nccl_.reset();
    for (NcclTensors::Channel* c : {&main_, &up_, &down_}) {
      if (!c->comm) continue;
      cudaStreamSynchronize(c->stream);
      ncclCommDestroy(c->comm);
      cudaStreamDestroy(c->stream);
    }
  }
  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  TensorComm& tensors() override { return *tensors_nccl_; }

  // Host memory: the bootstrap's calls.
  void allreduce_sum(float* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_max(float* x, int64_t n) override { boot_->allreduce_max(x, n); }
  void allreduce_sum(double* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_sum(int64_t* x, int64_t n) override { boot_->allreduce_sum(x, n); }
  void allreduce_min(int64_t* x, int64_t n) override { boot_->allreduce_min(x, n); }
  void allreduce_max(int64_t* x, int64_t n) override { boot_->allreduce_max(x, n); }
  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override { return boot_->iallreduce_sum(x, t, n); }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    return boot_->ireduce_scatter_sum(in, out, t, n);
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    return boot_->iallgather_inplace(buf, t, n);
  }
  void allgather_inplace(float* buf, int64_t n) override { boot_->allgather_inplace(buf, n); }
  void broadcast(void* buf, size_t bytes, int root) override { boot_->broadcast(buf, bytes, root); }
  void send(const void* buf, size_t bytes, int dst, int tag) override { boot_->send(buf, bytes, dst, tag); }
  void recv(void* buf, size_t bytes, int src, int tag) override { boot_->recv(buf, bytes, src, tag); }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) override {
    return boot_->isend(buf, bytes, dst, tag);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) override {
    return boot_->irecv(buf, bytes, src, tag);
  }
  void barrier() override { boot_->barrier(); }
  [[noreturn]] void abort(int code) override {
    for (NcclTensors::Channel* c : {&main_, &up_, &down_})
      if (c->comm) ncclCommAbort(c->comm);
    boot_->abort(code);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> sub_boot = boot_->split(color, key);
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(main_.comm, color, key, &sub, nullptr), "ncclCommSplit");
    auto c = std::make_unique<NcclComm>(std::move(sub_boot), sub, false);
    c->set_device(device_);
    return c;
  }

 private:
  static NcclTensors::Channel channel(ncclComm_t comm) {
    NcclTensors::Channel c;
    c.comm = comm;
    cu_check(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    return c;
  }
  std::unique_ptr<Communicator> boot_;
  NcclTensors::Channel main_, up_, down_;
  std::unique_ptr<NcclTensors> tensors_nccl_;
};

// Whether two ranks of `world` use the same GPU (this rank's current device, on its host):
// then NCCL cannot serve them and the MPI communicator stages through host memory. Collective.
bool ranks_share_a_gpu(Communicator& world) {
  int dev = 0, count = 0;
  cu_check(cudaGetDevice(&dev), "cudaGetDevice");
  cu_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const int color = static_cast<int>(std::hash<std::string>{}(host) & 0x7fffffff);
  auto node = world.split(color, world.rank());
  std::vector<int64_t> users(static_cast<size_t>(std::max(count, dev + 1)), 0);
  users[static_cast<size_t>(dev)] = 1;
  node->allreduce_sum(users.data(), static_cast<int64_t>(users.size()));
  int64_t shared = 0;
  for (int64_t u : users) shared = std::max<int64_t>(shared, u > 1 ? 1 : 0);
  world.allreduce_max(&shared, 1);  // every rank takes the same path
  return shared != 0;
}

}  // namespace

std::unique_ptr<Communicator> nccl_comm(std::unique_ptr<Communicator> bootstrap) {
  std::string why;
  if (!ops::cuda::device_available(&why)) throw std::runtime_error("nccl_comm: no CUDA device: " + why);
  ops::Backend& be = ops::cuda::cuda_backend();  // the compute stream exists before the first collective
  ncclUniqueId id{};
  if (bootstrap->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  bootstrap->broadcast(&id, sizeof(id), 0);  // MPI's only part: the unique id
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank()), "ncclCommInitRank");
  auto c = std::make_unique<NcclComm>(std::move(bootstrap), comm, true);
  c->set_device(&be);
  return c;
}

std::unique_ptr<Communicator> host_staged_comm(std::unique_ptr<Communicator> bootstrap) {
  bootstrap->set_device(&ops::cuda::cuda_backend());  // tensors(): staged through host memory
  return bootstrap;
}

std::unique_ptr<Communicator> gpu_world(std::unique_ptr<Communicator> world, std::string* how) {
  const bool forced = ops::knobs().host_staged_comm;
  if (forced || ranks_share_a_gpu(*world)) {
    if (how) *how = forced ? "host-staged (RUNNER_HOST_STAGED_COMM=1)" : "host-staged (ranks share a GPU)";
    return host_staged_comm(std::move(world));
  }
  if (how) *how = "NCCL";
  return nccl_comm(std::move(world));
}

}  // namespace parallel
