// The device the graph-level tests run on: the strict CPU device when RUNNER_STRICT=1
// (the NAME_strict variants of cmake/strict_tests.cmake), the CPU backend otherwise. Design: a
// test takes it once, before it makes any tensor, and hands it to its executors, as the runner's
// select_backend does; it reads and writes tensors only through the crossings below, so one
// test body checks the plain CPU and, on the strict device, that nothing on the path touches
// device memory from the host.
#pragma once
#include <vector>

#include "ops/backend.h"
#include "ops/tensor.h"

namespace test_support {

// The backend to run on. On the strict device the first call also makes it the device new
// tensors are allocated on (ops::set_tensor_device), like a run with hardware.device cpu-strict.
ops::Backend& test_device();

// A tensor's values on the host (the crossing out; waits), widened to fp32 from bf16 / fp16.
std::vector<float> host_values(const ops::Tensor& t);
// Its bytes as stored.
std::vector<char> host_bytes(const ops::Tensor& t);
// t := v rounded to t's dtype (the crossing in); v.size() == t.numel().
void set_values(ops::Tensor& t, const std::vector<float>& v);

}  // namespace test_support
