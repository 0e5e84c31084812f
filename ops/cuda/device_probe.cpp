// device_available() and device_description() (cuda_backend.h): the CUDA runtime only, no
// cuBLASLt, so that the runner binary can ask for a GPU without loading cuBLASLt (hundreds of
// MB, ~2 s of start-up on a loaded machine, paid by every rank of every run).
#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "ops/cuda/cuda_backend.h"

namespace ops::cuda {

bool device_available(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky error
    return false;
  }
  if (n < 1) {
    if (why) *why = "cudaGetDeviceCount reports no device";
    return false;
  }
  return true;
}

std::string device_description() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA device 0 (properties unavailable)";
  char gib[32];
  std::snprintf(gib, sizeof(gib), "%.1f", static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + gib + " GiB";
}

}  // namespace ops::cuda
