// Bulk fp32 <-> bf16 / fp16 conversion (see ops/convert.h): the scalar rules, in loops the
// compiler vectorises, over OpenMP threads for large buffers.
#include "ops/convert.h"

#include <stdexcept>
#include <string>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

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
#if defined(__AVX512F__)
    // VCVTPH2PS: exact (every fp16 value is an fp32 value, subnormals included; MXCSR's DAZ does
    // not apply to it), 16 at a time.
    const int64_t blocks = n / 16;
#pragma omp parallel for if (n > kParallel)
    for (int64_t b = 0; b < blocks; ++b)
      _mm512_storeu_ps(dst + b * 16, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b * 16))));
    for (int64_t i = blocks * 16; i < n; ++i) dst[i] = f16_to_f32(s[i]);
#else
#pragma omp parallel for if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
#endif
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
#if defined(__AVX512F__)
    // VCVTPS2PH with round to nearest even: IEEE rounding, overflow to inf, gradual underflow
    // through subnormals (MXCSR's FTZ does not apply to it), NaN kept NaN (quieted), 16 at a time.
    const int64_t blocks = n / 16;
#pragma omp parallel for if (n > kParallel)
    for (int64_t b = 0; b < blocks; ++b)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b * 16),
                          _mm512_cvtps_ph(_mm512_loadu_ps(src + b * 16), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (int64_t i = blocks * 16; i < n; ++i) d[i] = f32_to_f16(src[i]);
#else
#pragma omp parallel for if (n > kParallel)
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
#endif
  } else {
    bad(t);
  }
}

}  // namespace ops
