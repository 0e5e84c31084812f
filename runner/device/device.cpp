// Backend selection from hardware.device (device.h); the only place that names a backend.
#include "runner/device/device.h"

#include "ops/gemm_path.h"
#include "ops/knobs.h"
#include "ops/strict/strict_backend.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#if defined(RUNNER_HAVE_CUDA)
#include "ops/cuda/cuda_backend.h"
#endif

namespace runner {

ops::Backend& select_backend(const Recipe& r) {
  // RUNNER_STRICT=1: a recipe on the host's CPU runs on the strict checking device instead
  // (ops/strict/strict_backend.h), the way the test suite runs its device tests on it. The
  // recipe itself is left as written: cpu and cpu-strict plan alike (the host's memory and
  // peak), so only the backend differs.
  if (r.hardware.device == "cpu-strict" || (r.hardware.device == "cpu" && ops::knobs().strict)) {
    ops::Backend& be = ops::strict::strict_backend();
    ops::set_tensor_device(&be);  // every tensor the run makes from here on is device memory
    return be;
  }
  if (!device_kind(r.hardware).gpu) return ops::cpu_backend();
  const std::string what = "hardware.device " + r.hardware.device + " selects the CUDA backend, but ";
  const std::string fix = "train on the CPU with --set hardware.device=cpu (or hardware: device: cpu in the recipe)";
#if defined(RUNNER_HAVE_CUDA)
  std::string why;
  if (!ops::cuda::device_available(&why)) throw UserError(r.loc("hardware.device"), what + "no CUDA device was found (" + why + ")", fix);
  ops::Backend* be = nullptr;
  try {
    be = &ops::cuda::cuda_backend();
  } catch (const std::runtime_error& e) {  // a device is there but CUDA cannot start on it (memory, driver)
    throw UserError(r.loc("hardware.device"), what + "the CUDA backend could not start on " +
                                                  ops::cuda::device_description() + ": " + e.what(), fix);
  }
  // From here every tensor the run makes is device memory, and 16-bit Linears read their
  // operands as stored through cuBLASLt (the plan's dry run prices the same path).
  ops::set_tensor_device(be);
  ops::set_gemm_paths(ops::device_gemm_paths());
  ops::set_device_timer(&ops::cuda::cuda_timer());  // the profiler times the GPU's queue
  return *be;
#else
  throw UserError(r.loc("hardware.device"), what + "this runner was built without CUDA, so no CUDA device was found", fix);
#endif
}

}  // namespace runner
