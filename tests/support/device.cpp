// The tests' device and their crossings (device.h).
#include "tests/support/device.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ops/convert.h"
#include "ops/knobs.h"
#include "ops/strict/strict_backend.h"

namespace test_support {

ops::Backend& test_device() {
  static ops::Backend* be = [] {
    if (!ops::knobs().strict) return &ops::cpu_backend();
    ops::Backend* strict = &ops::strict::strict_backend();
    ops::set_tensor_device(strict);
    return strict;
  }();
  return *be;
}

std::vector<char> host_bytes(const ops::Tensor& t) {
  std::vector<char> b(t.nbytes());
  t.read_to_host(b.data());
  return b;
}

std::vector<float> host_values(const ops::Tensor& t) {
  std::vector<char> b = host_bytes(t);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == ops::DType::F32) std::memcpy(v.data(), b.data(), b.size());
  else ops::to_f32(v.data(), b.data(), t.dtype(), t.numel());
  return v;
}

void set_values(ops::Tensor& t, const std::vector<float>& v) {
  if (static_cast<int64_t>(v.size()) != t.numel()) throw std::logic_error("set_values: " + t.shape_str() + " vs " + std::to_string(v.size()));
  if (t.dtype() == ops::DType::F32) {
    t.write_from_host(v.data());
    return;
  }
  std::vector<char> b(t.nbytes());
  ops::from_f32(b.data(), t.dtype(), v.data(), t.numel());
  t.write_from_host(b.data());
}

}  // namespace test_support
