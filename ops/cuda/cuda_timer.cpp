// The CUDA backend's DeviceTimer (ops/device_timer.h): marks are CUDA events recorded on the
// compute stream, kept in a pool and reused; ranges are NVTX ranges named like the operators
// ("linear", "attention backward"), so Nsight Systems shows the executor's nodes over the kernels.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cuda/cuda_backend.h"
#include "ops/device_timer.h"

namespace ops::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA timer: ") + what + ": " + cudaGetErrorString(e));
}

class CudaTimer final : public DeviceTimer {
 public:
  int64_t record() override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t id;
    if (free_.empty()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
      id = static_cast<int64_t>(events_.size()) - 1;
    } else {
      id = free_.back();
      free_.pop_back();
    }
    check(cudaEventRecord(events_[static_cast<size_t>(id)], static_cast<cudaStream_t>(compute_stream())), "cudaEventRecord");
    return id;
  }
  double elapsed_ms(int64_t a, int64_t b) override {
    cudaEvent_t ea, eb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ea = events_[static_cast<size_t>(a)];
      eb = events_[static_cast<size_t>(b)];
    }
    check(cudaEventSynchronize(eb), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ea, eb), "cudaEventElapsedTime");
    return ms;
  }
  void release(int64_t mark) override {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(mark);
  }
  void wait() override { synchronize(); }
  void push_range(const char* op, char pass) override {
    const char* suffix = pass == 'b' ? " backward" : pass == 'r' ? " recompute" : "";
    thread_local std::string name;
    name.assign(op).append(suffix);
    nvtxRangePushA(name.c_str());
  }
  void pop_range() override { nvtxRangePop(); }
  Memory memory() override {
    const DeviceMemory d = device_memory();
    return {d.pool_used, d.pool_reserved, d.total - d.free, d.total};
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> events_;  // lives until exit, like the backend
  std::vector<int64_t> free_;
};

}  // namespace

DeviceTimer& cuda_timer() {
  static CudaTimer* t = new CudaTimer();  // never destroyed: CUDA tears down its own state at exit
  return *t;
}

}  // namespace ops::cuda
