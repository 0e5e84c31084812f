// Conversions between fp32 and the 16-bit storage formats (bf16, fp16).
//
// Rounding is IEEE round to nearest, ties to even, in both formats. bf16 keeps fp32's exponent
// range (a NaN stays a NaN, quietened); fp16 overflows to inf past 65504 and underflows
// through its subnormals (down to 2^-24) to signed zero, as the format does.
#pragma once
#include <cstdint>
#include <cstring>

#include "ops/tensor.h"

namespace ops {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf, NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (a >= 0x38800000u) {  // normal in fp16 (>= 2^-14)
    uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal: the value in units of 2^-24, rounded to nearest even.
  const uint32_t exp = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 2^-24 units: man * 2^(exp-127-23) / 2^-24
  const uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
  const uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | r);
}

// dst[i] = src[i] widened; src holds n elements of the 16-bit dtype t (BF16 or F16).
void to_f32(float* dst, const void* src, DType t, int64_t n);
// dst[i] = src[i] rounded to the 16-bit dtype t.
void from_f32(void* dst, DType t, const float* src, int64_t n);

}  // namespace ops
