// The backend a run uses, chosen once when the run starts and passed to everything that runs
// kernels (the trainer, the rank model, the optimizer, the trained model of generate and
// export): nothing below this room names a backend. hardware.device `cuda` or a GPU kind of
// the device table (devices.h) selects the CUDA backend (ops/cuda/); `cpu` and `custom` the
// CPU backend.
#pragma once
#include <string>

#include "ops/backend.h"
#include "runner/recipe/recipe.h"

namespace runner {

// The backend for a run of the recipe (`runner train`, `runner resume`). Throws UserError
// (exit 2, at hardware.device) when the recipe names a GPU and this runner has no usable one:
// built without CUDA, or no CUDA device found (the CUDA runtime's reason). With one, the CUDA
// backend: it becomes the tensor device (every tensor made afterwards is device memory) and
// the GEMM paths become cuBLASLt's (ops::device_gemm_paths()). cpu-strict likewise sets the
// strict device. Call before anything is written and before any GEMM runs: the CPU backend
// selects OpenBLAS's kernels when first taken.
ops::Backend& select_backend(const Recipe& r);

}  // namespace runner
