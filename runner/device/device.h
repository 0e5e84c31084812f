// Which backend a recipe trains on: hardware.device `cuda`, or a GPU kind the plan knows
// (a100-40gb, a100-80gb, h100-80gb, h200, v100-32gb, l40s), selects the CUDA backend
// (ops/cuda/); `cpu` and `custom` the CPU backend.
#pragma once
#include <string>

#include "ops/backend.h"
#include "runner/recipe/recipe.h"

namespace runner {

bool wants_gpu(const std::string& device);

// The backend for the recipe. Throws UserError (exit 2, at hardware.device) when the recipe
// names a GPU and this runner has no usable one: built without CUDA, no CUDA device found
// (the CUDA runtime's reason), or, with a device, because `runner train` does not run on the
// GPU yet (the executor's tensors live in host memory; the CUDA kernels are tested on their
// own, tests/cuda/). Call before anything is written.
ops::Backend& select_backend(const Recipe& r);

}  // namespace runner
