// The CUDA backend: ops/backend.h on an NVIDIA GPU (cuBLASLt GEMMs, our own kernels).
//
// Every pointer the Backend calls take is a device pointer (DeviceBuffer below, or any
// cudaMalloc'd memory). Kernels run in order on one compute stream; the host calls here
// (copies, sum_squares, the loss's target check) wait for it. This header includes no CUDA
// header, so host-only code (runner/, tests) can use it; it exists only in builds with
// RUNNER_HAVE_CUDA (cmake/cuda_targets.cmake).
//
// The backend owns its tensors' memory: host_memory() is false, mem_alloc/mem_free
// are stream-ordered allocations from the device's memory pool (kept cached), copies and the
// generic kernels are queued on the compute stream, copy_in stages through pinned slots so the
// host buffer is reusable on return. `runner train` with a GPU device kind runs on it
// (runner/device/device.cpp).
//
// Status: compiled for sm_90 + compute_90 PTX and linked in CI, which has no GPU; the kernels
// have not yet run on a GPU (tests/cuda/test_cuda_kernels.cpp compares each with the CPU
// kernels when one is present, scripts/gpu-check.sh runs it on the H200 machine).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/backend.h"
#include "ops/device_timer.h"
#include "ops/tensor.h"

namespace ops::cuda {

// Whether a CUDA device can be used: false (with the CUDA runtime's reason in *why) when
// cudaGetDeviceCount fails or reports none.
bool device_available(std::string* why = nullptr);
// "NVIDIA H200, sm_90, 139.8 GiB" for device 0 (device_available() first).
std::string device_description();

// The CUDA backend on device 0 (created on first use; throws std::runtime_error without a device).
Backend& cuda_backend();
// Whether cuBLASLt, which the backend loads when it starts (dlopen, not linked: every runner
// process links this backend), can be loaded here; why not in *why. Needs no GPU.
bool cublaslt_loadable(std::string* why = nullptr);

// Device memory counted in the ledger's accounts (MemoryTracker), like ops::Storage on the host.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, Account account, bool zero = true);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* ptr() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  Account account() const { return account_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Account account_ = Account::Workspace;
};

// Host <-> device copies on the compute stream; both wait for the stream (after earlier kernels).
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void synchronize();
// The compute stream (a cudaStream_t), for communicators that order their stream after it.
void* compute_stream();
// cudaMemGetInfo: bytes free and total on the current device (to cross-check the accounts).
void memory_info(size_t* free_bytes, size_t* total_bytes);

// The device's memory as CUDA sees it, to cross-check the ledger's accounts (which count what
// tensors hold): the pool's bytes handed out and reserved (cached), and cudaMemGetInfo's.
struct DeviceMemory {
  size_t pool_used = 0, pool_reserved = 0, free = 0, total = 0;
};
DeviceMemory device_memory();

// Pinned (page-locked) host memory, for asynchronous checkpoint copies.
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);

// A fused linear + bias + GELU (cuBLASLt's GELU_AUX_BIAS epilogue, GELU tanh approximation):
// pre (N,OC) = inp @ weight^T + bias, out = gelu(pre). Not part of ops/backend.h (no caller
// there fuses them yet); tested against matmul_forward + gelu_forward.
void matmul_bias_gelu_forward(Backend& be, float* out, float* pre, const float* inp, const float* weight,
                              const float* bias, int N, int C, int OC);

// The device timer of the compute stream (ops/device_timer.h): CUDA events and NVTX ranges.
// runner/device/device.cpp installs it with the backend, so the executor's per-operator table
// and the step's breakdown time the GPU's work, not the host's launches.
DeviceTimer& cuda_timer();

// NVTX range named like an operator (a no-op unless a profiler is attached).
void nvtx_push(const char* name);
void nvtx_pop();

}  // namespace ops::cuda
