// Bulk fp32 <-> bf16 / fp16 conversion (see ops/convert.h): the scalar rules, in loops the
// compiler vectorises, over OpenMP threads for large buffers.
#include "ops/convert.h"

#include <stdexcept>
#include <string>

namespace ops {

namespace {
constexpr int64_t kParallel = 1 << 16;
[[noreturn]] void bad(DType t) { throw std::invalid_argument(std::string("16-bit conversion of ") + dtype_name(t)); }
}  // namespace

void to_f32(float* dst, const void* src, DType t, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (t == DType::BF16) {
#pragma omp parallel for simd if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else if (t == DType::F16) {
#pragma omp parallel for if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
  } else {
    bad(t);
  }
}

void from_f32(void* dst, DType t, const float* src, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (t == DType::BF16) {
#pragma omp parallel for simd if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else if (t == DType::F16) {
#pragma omp parallel for if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else {
    bad(t);
  }
}

}  // namespace ops
