// Backend selection from hardware.device (device.h); the only place that names a backend.
#include "runner/device/device.h"

#include "runner/device/devices.h"
#include "runner/errors.h"
#include "ops/strict/strict_backend.h"
#if defined(RUNNER_HAVE_CUDA)
#include "ops/cuda/cuda_backend.h"
#endif

namespace runner {

bool wants_gpu(const std::string& device) {
  const DeviceKind* d = find_device_kind(device);
  return d && d->gpu;
}

ops::Backend& select_backend(const Recipe& r) {
  if (r.hardware.device == "cpu-strict") {
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
  throw UserError(r.loc("hardware.device"),
                  what + "`runner train` does not run on the GPU yet (found " + ops::cuda::device_description() +
                      "; the CUDA kernels are built and tested on their own, see README's GPU section)",
                  fix);
#else
  throw UserError(r.loc("hardware.device"), what + "this runner was built without CUDA, so no CUDA device was found", fix);
#endif
}

ops::Backend& host_backend() { return ops::cpu_backend(); }

}  // namespace runner
