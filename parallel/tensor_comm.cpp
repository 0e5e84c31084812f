// The tensor-memory face of a communicator (comm.h, TensorComm): direct on a host-memory
// device, host-staged on a device whose memory the host cannot touch.
//
// Staging (cpu-strict, and a GPU without NCCL or with several ranks on one GPU): every call
// queues copy_out of the device bytes into a host staging buffer, waits for the device's
// queue (so the bytes are the ones the kernels before it wrote), runs the communicator's host
// call on the buffer, and queues copy_in of the result back (copy_in reads the buffer before
// it returns, so the buffer is free again at once). A non-blocking call keeps its buffer until
// it completes; the copy back is queued when test() or wait() first sees it complete, which is
// before the caller can use the result (it must wait for the request first). Staging buffers
// are host memory, reused across calls (a pool, best fit), outside the ledger's accounts: the
// ledger measures the device's memory, and these are the host's, as MPI's own buffers are.
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "parallel/comm.h"

namespace parallel {

namespace {

// Host pointers straight to the communicator's host calls.
class DirectTensors final : public TensorComm {
 public:
  explicit DirectTensors(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void allreduce_sum(float* x, int64_t n) override { c_.allreduce_sum(x, n); }
  void allreduce_max(float* x, int64_t n) override { c_.allreduce_max(x, n); }
  void allgather(const float* in, float* out, int64_t n) override { c_.allgather(in, out, n); }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override { c_.reduce_scatter_sum(in, out, n); }
  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override { return c_.iallreduce_sum(x, t, n); }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    return c_.ireduce_scatter_sum(in, out, t, n);
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    return c_.iallgather_inplace(buf, t, n);
  }
  void send(const void* buf, size_t bytes, int dst, int tag) override { c_.send(buf, bytes, dst, tag); }
  void recv(void* buf, size_t bytes, int src, int tag) override { c_.recv(buf, bytes, src, tag); }
  std::unique_ptr<Request> isend(const void* buf, size_t bytes, int dst, int tag) override {
    return c_.isend(buf, bytes, dst, tag);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t bytes, int src, int tag) override {
    return c_.irecv(buf, bytes, src, tag);
  }

 private:
  Communicator& c_;
};

// Host staging buffers, reused: a buffer returns to the pool when its call completes.
class StagingPool {
 public:
  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool() {
    for (auto& [cap, p] : free_) ops::host_block_free(p, cap);
  }
  struct Buf {
    char* p = nullptr;
    size_t cap = 0;
  };
  Buf acquire(size_t bytes) {
    bytes = std::max<size_t>(bytes, 64);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->first >= bytes && (best == free_.end() || it->first < best->first)) best = it;
    Buf b;
    if (best != free_.end()) {
      b = {best->second, best->first};
      free_.erase(best);
    } else {
      b = {static_cast<char*>(ops::host_block_alloc(bytes)), bytes};
      total_ += bytes;
      peak_ = std::max(peak_, total_);
    }
    return b;
  }
  void release(Buf b) {
    if (b.p) free_.emplace_back(b.cap, b.p);
  }
  size_t peak() const { return peak_; }

 private:
  std::vector<std::pair<size_t, char*>> free_;
  size_t total_ = 0, peak_ = 0;
};

// A non-blocking call on a staging buffer: when the host request completes, `finish` copies
// the result back (queued on the device), and the buffer goes back to the pool.
class StagedRequest final : public Request {
 public:
  StagedRequest(std::unique_ptr<Request> inner, std::shared_ptr<StagingPool> pool, StagingPool::Buf buf,
                std::function<void(const char*)> finish)
      : inner_(std::move(inner)), pool_(std::move(pool)), buf_(buf), finish_(std::move(finish)) {}
  StagedRequest(const StagedRequest&) = delete;
  StagedRequest& operator=(const StagedRequest&) = delete;
  ~StagedRequest() override {
    if (done_) return;
    inner_.reset();  // waits for the host call
    try {
      complete();
    } catch (...) {  // no throwing from a destructor: the device reports its error at the next synchronize
    }
  }
  bool test() override {
    if (!done_ && inner_->test()) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    complete();
  }

 private:
  void complete() {
    done_ = true;
    if (finish_) finish_(buf_.p);
    pool_->release(buf_);
  }
  std::unique_ptr<Request> inner_;
  std::shared_ptr<StagingPool> pool_;
  StagingPool::Buf buf_;
  std::function<void(const char*)> finish_;
  bool done_ = false;
};

class StagedTensors final : public TensorComm {
 public:
  StagedTensors(Communicator& c, ops::Backend& dev) : c_(c), dev_(dev), pool_(std::make_shared<StagingPool>()) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  bool staged() const override { return true; }
  size_t staging_peak_bytes() const override { return pool_->peak(); }

  void allreduce_sum(float* x, int64_t n) override {
    blocking(x, bytes(n, 4), [&](char* h) { c_.allreduce_sum(reinterpret_cast<float*>(h), n); });
  }
  void allreduce_max(float* x, int64_t n) override {
    blocking(x, bytes(n, 4), [&](char* h) { c_.allreduce_max(reinterpret_cast<float*>(h), n); });
  }
  void allgather(const float* in, float* out, int64_t n) override {
    const size_t blk = bytes(n, 4), all = blk * static_cast<size_t>(size());
    if (size() == 1) return copy(out, in, blk);
    auto b = pool_->acquire(all);
    out_of(b.p + blk * static_cast<size_t>(rank()), in, blk);
    c_.allgather_inplace(reinterpret_cast<float*>(b.p), n);
    in_to(out, b.p, all);
    pool_->release(b);
  }
  void reduce_scatter_sum(const float* in, float* out, int64_t n) override {
    const size_t blk = bytes(n, 4), all = blk * static_cast<size_t>(size());
    if (size() == 1) return copy(out, in, blk);
    auto b = pool_->acquire(all + blk);
    out_of(b.p, in, all);
    c_.reduce_scatter_sum(reinterpret_cast<const float*>(b.p), reinterpret_cast<float*>(b.p + all), n);
    in_to(out, b.p + all, blk);
    pool_->release(b);
  }

  std::unique_ptr<Request> iallreduce_sum(void* x, ops::DType t, int64_t n) override {
    const size_t nb = bytes(n, ops::dtype_size(t));
    auto b = pool_->acquire(nb);
    out_of(b.p, x, nb);
    return staged(c_.iallreduce_sum(b.p, t, n), b, [d = &dev_, x, nb](const char* h) { copy_in(*d, x, h, nb); });
  }
  std::unique_ptr<Request> ireduce_scatter_sum(const void* in, void* out, ops::DType t, int64_t n) override {
    const size_t blk = bytes(n, ops::dtype_size(t)), all = blk * static_cast<size_t>(size());
    auto b = pool_->acquire(all + blk);
    out_of(b.p, in, all);
    return staged(c_.ireduce_scatter_sum(b.p, b.p + all, t, n), b,
                  [d = &dev_, out, all, blk](const char* h) { copy_in(*d, out, h + all, blk); });
  }
  std::unique_ptr<Request> iallgather_inplace(void* buf, ops::DType t, int64_t n) override {
    const size_t blk = bytes(n, ops::dtype_size(t)), all = blk * static_cast<size_t>(size());
    auto b = pool_->acquire(all);
    const size_t mine = blk * static_cast<size_t>(rank());  // the only block an in-place gather reads
    out_of(b.p + mine, static_cast<const char*>(buf) + mine, blk);
    return staged(c_.iallgather_inplace(b.p, t, n), b, [d = &dev_, buf, all](const char* h) { copy_in(*d, buf, h, all); });
  }

  void send(const void* buf, size_t nb, int dst, int tag) override {
    auto b = pool_->acquire(nb);
    out_of(b.p, buf, nb);
    c_.send(b.p, nb, dst, tag);
    pool_->release(b);
  }
  void recv(void* buf, size_t nb, int src, int tag) override {
    auto b = pool_->acquire(nb);
    c_.recv(b.p, nb, src, tag);
    in_to(buf, b.p, nb);
    pool_->release(b);
  }
  std::unique_ptr<Request> isend(const void* buf, size_t nb, int dst, int tag) override {
    auto b = pool_->acquire(nb);
    out_of(b.p, buf, nb);
    return staged(c_.isend(b.p, nb, dst, tag), b, nullptr);
  }
  std::unique_ptr<Request> irecv(void* buf, size_t nb, int src, int tag) override {
    auto b = pool_->acquire(nb);
    return staged(c_.irecv(b.p, nb, src, tag), b, [d = &dev_, buf, nb](const char* h) { copy_in(*d, buf, h, nb); });
  }

 private:
  static size_t bytes(int64_t n, size_t elem) { return n > 0 ? static_cast<size_t>(n) * elem : 0; }
  // Device -> host: queued after the kernels before it, then waited for.
  void out_of(void* host, const void* dev, size_t nb) {
    if (nb > 0) dev_.copy_out(host, dev, nb);
    dev_.synchronize();
  }
  // Host -> device, queued (the host buffer is free on return). Static: a request may finish
  // after this face is gone (the device outlives both).
  static void copy_in(ops::Backend& d, void* dev, const void* host, size_t nb) {
    if (nb > 0) d.copy_in(dev, host, nb);
  }
  void in_to(void* dev, const void* host, size_t nb) { copy_in(dev_, dev, host, nb); }
  void copy(void* dst, const void* src, size_t nb) {
    if (dst != src && nb > 0) dev_.copy(dst, src, nb);
  }
  template <class F>
  void blocking(void* x, size_t nb, F&& call) {
    auto b = pool_->acquire(nb);
    out_of(b.p, x, nb);
    call(b.p);
    in_to(x, b.p, nb);
    pool_->release(b);
  }
  std::unique_ptr<Request> staged(std::unique_ptr<Request> inner, StagingPool::Buf b,
                                  std::function<void(const char*)> finish) {
    return std::make_unique<StagedRequest>(std::move(inner), pool_, b, std::move(finish));
  }

  Communicator& c_;
  ops::Backend& dev_;
  std::shared_ptr<StagingPool> pool_;
};

}  // namespace

Communicator::Communicator() = default;
Communicator::~Communicator() = default;

void Communicator::set_device(ops::Backend* device) {
  if (device == device_) return;
  device_ = device;
  tensors_.reset();
}

TensorComm& Communicator::tensors() {
  if (!tensors_) {
    if (device_ && !device_->host_memory()) tensors_ = std::make_unique<StagedTensors>(*this, *device_);
    else tensors_ = std::make_unique<DirectTensors>(*this);
  }
  return *tensors_;
}

}  // namespace parallel
