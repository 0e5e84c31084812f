// One tile's conversions between fp32 and a 16-bit format, for kernels that already run inside
// an OpenMP team (the 16-bit-native operators, the fused AdamW pass): ops/convert.h's rules
// (bf16: the scalar rule, vectorised; fp16: VCVTPH2PS / VCVTPS2PH on whole 16-element groups
// from the start and the scalar rule on the tail, as ops/cpu/convert.cpp splits them), so the
// bits are to_f32's and from_f32's, but without their OpenMP regions (a nested region per tile
// costs more than the conversion). Widening is exact in both formats; bf16's rounding is
// integer arithmetic, the same bits however vectorised; fp16's vector and scalar rules differ
// only in a NaN's payload.
#pragma once
#include <cstdint>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "ops/convert.h"
#include "ops/tensor.h"

namespace ops::cpu {

// d[i] = s[i] widened to fp32.
inline void tile_to_f32(float* __restrict d, const uint16_t* __restrict s, DType t, int64_t n) {
  if (t == DType::BF16) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
#endif
  for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
}

// d[i] = s[i] rounded to nearest even in format t.
inline void tile_from_f32(uint16_t* __restrict d, const float* __restrict s, DType t, int64_t n) {
  if (t == DType::BF16) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) d[i] = f32_to_f16(s[i]);
}

// d[i] := RNE_t(d[i] + (0 + g[i])), i in [0, n): Backend::accumulate's fold of an fp32 gradient
// into a 16-bit one, in pieces of 64 through a stack buffer. The `0 +` is the zeroed fp32 buffer
// the widened path accumulates into (a -0 contribution there is +0), so g may be a kernel's
// written result as well as one accumulated into zeros (where adding 0 again changes nothing).
inline void tile_fold(uint16_t* d, const float* g, DType t, int64_t n) {
  constexpr int64_t kPiece = 64;
  float tmp[kPiece];
  for (int64_t i0 = 0; i0 < n; i0 += kPiece) {
    const int64_t m = n - i0 < kPiece ? n - i0 : kPiece;
    tile_to_f32(tmp, d + i0, t, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) tmp[i] += 0.0f + g[i0 + i];
    tile_from_f32(d + i0, tmp, t, m);
  }
}

}  // namespace ops::cpu
