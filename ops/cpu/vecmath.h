// Vectorizable math and the OpenMP work-splitting helper for the CPU kernels.
//
// glibc's expf is exact to < 1 ulp but GCC only vectorizes it under -ffast-math, which we
// do not want globally (it would also reassociate our reductions everywhere). exp_f is a
// branch-free Cephes-style expf (Moshier, "Methods and Programs for Mathematical Functions",
// 1989: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then a degree-6 minimax
// polynomial for e^r), written with plain arithmetic and bit casts only so that GCC
// vectorizes it inside `#pragma omp simd` loops (16 lanes with AVX-512). Its error is
// ~1 ulp (max relative error 8e-8 on [-87.3, 88.7], checked by tests/test_ops_pointwise.cpp),
// far below the 1e-5 tolerance the kernels are held to. GELU built on it runs ~25x faster
// per thread than a loop over libm's tanhf (bench/bench_kernels).
//
// Everything derived from it (sigmoid, gelu, silu) is written in a form without
// catastrophic cancellation, e.g. 0.5 x (1 + tanh u) = x * sigmoid(2u).
//
// Also here: explicit 16-float vectors (vf16, exp16) for loops where `omp simd` falls short,
// and parallel_chunks / parallel_blocks, the ways the kernels split work across the OpenMP
// team (parallel_blocks for reductions: its blocks do not depend on the thread count).
#pragma once
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace ops::cpu {

#define OPS_INLINE inline __attribute__((always_inline))

// e^x in fp32. Returns 0 below -87.34 (where the true result is subnormal: flushing it
// avoids the ~100-cycle subnormal assists, an absolute error < 1.2e-38) and +inf above
// 88.72 (the true overflow threshold); NaN propagates through the polynomial.
OPS_INLINE float exp_f(float x) {
  const float lo = -87.3365f, hi = 88.7228f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  // n = round(x / ln2) via the 1.5*2^23 trick (exact round-to-nearest for |n| < 2^22).
  const float magic = 12582912.0f;
  float n = (xc * 1.44269504088896341f + magic) - magic;
  // r = x - n ln2 in two steps (Cody-Waite): ln2 = 0.693359375 - 2.12194440e-4, the first part
  // has few mantissa bits so n*C1 is exact.
  float r = xc - n * 0.693359375f;
  r = r - n * (-2.12194440e-4f);
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n with n in [-126, 128] as 2^n1 * 2^n2 (n1 = floor(n/2)), so both factors are normal
  // floats even at n = 128, where e^x is still finite (up to 3.4e38).
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni >> 1, n2 = ni - n1;
  float y = p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  return x < lo ? 0.0f : y;
}

// 1 / (1 + e^-x), accurate in both tails (no 1 - small cancellation).
OPS_INLINE float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
// (Hendrycks & Gimpel 2016, eq. after (2)). Since 1 + tanh(u) = 2 sigmoid(2u),
// gelu(x) = x sigmoid(2u), and gelu'(x) = s + 2 x s (1 - s) u' with s = sigmoid(2u).
constexpr float kGeluA = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluB = 0.044715f;
OPS_INLINE float gelu_f(float x) {
  float u = kGeluA * (x + kGeluB * x * x * x);
  return x * sigmoid_f(2.0f * u);
}
OPS_INLINE float gelu_grad_f(float x) {
  float u = kGeluA * (x + kGeluB * x * x * x);
  float du = kGeluA * (1.0f + 3.0f * kGeluB * x * x);
  float s = sigmoid_f(2.0f * u);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

// Squared ReLU: relu(x)^2 and its derivative 2 relu(x). Written with `x < 0` so that a NaN
// input stays NaN (a `x > 0 ? ... : 0` form would turn it into 0 and hide an overflow).
OPS_INLINE float relu2_f(float x) { return x < 0.0f ? 0.0f : x * x; }
OPS_INLINE float relu2_grad_f(float x) { return x < 0.0f ? 0.0f : x + x; }

// ---- explicit 16-float vectors (GCC vector extensions: one zmm register with AVX-512,
// split into native widths elsewhere), for the row loops where `omp simd` reductions are
// lowered poorly (a lane array spilled to the stack, and a scalar epilogue even when the trip
// count is a multiple of 16).
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

OPS_INLINE vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
OPS_INLINE void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof v); }
OPS_INLINE vf16 splat16(float x) { return vf16{} + x; }
OPS_INLINE vi16 iota16() { return vi16{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
OPS_INLINE float hsum16(vf16 v) {
  float s = 0.0f;
  for (int i = 0; i < 16; i++) s += v[i];
  return s;
}
OPS_INLINE float hmax16(vf16 v) {
  float m = v[0];
  for (int i = 1; i < 16; i++) m = v[i] > m ? v[i] : m;
  return m;
}

// exp_f on 16 lanes: the same algorithm and constants, lane for lane the same results.
OPS_INLINE vf16 exp16(vf16 x) {
  const float lo = -87.3365f, hi = 88.7228f;
  const vf16 vlo = splat16(lo), vhi = splat16(hi);
  vf16 xc = x < vlo ? vlo : (x > vhi ? vhi : x);
  const vf16 magic = splat16(12582912.0f);
  vf16 n = (xc * 1.44269504088896341f + magic) - magic;
  vf16 r = xc - n * 0.693359375f;
  r = r - n * (-2.12194440e-4f);
  vf16 p = splat16(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi16 ni = __builtin_convertvector(n, vi16);
  const vi16 n1 = ni >> 1, n2 = ni - n1;
  vf16 y = p * (vf16)((n1 + 127) << 23) * (vf16)((n2 + 127) << 23);  // vector casts reinterpret bits
  y = x > vhi ? splat16(std::numeric_limits<float>::infinity()) : y;
  return x < vlo ? vf16{} : y;
}

// How many chunks parallel_chunks(n, min_chunk, ...) splits [0, n) into: one per OpenMP
// thread, but none smaller than min_chunk, and 1 when already inside a parallel region.
inline int num_chunks(int64_t n, int64_t min_chunk) {
  if (omp_in_parallel()) return 1;
  int nt = omp_get_max_threads();
  const int64_t by_size = n / std::max<int64_t>(min_chunk, 1);
  if (nt > by_size) nt = static_cast<int>(by_size);
  return std::max(nt, 1);
}

// Splits [0, n) into num_chunks(n, min_chunk) contiguous chunks, one per OpenMP thread, and
// calls f(begin, end) or f(begin, end, chunk) on each (chunk in [0, num_chunks), for
// per-chunk partial results). Runs inline when n < 2 * min_chunk (a parallel region costs
// ~5-20 us with OMP_WAIT_POLICY=PASSIVE, which a small loop does not repay) or when already
// inside a parallel region. Chunk boundaries are multiples of `align` elements so that each
// chunk starts on a vector boundary.
template <class F>
void parallel_chunks(int64_t n, int64_t min_chunk, F&& f, int64_t align = 16) {
  auto call = [&](int64_t b, int64_t e, int chunk) {
    if constexpr (std::is_invocable_v<F&, int64_t, int64_t, int>) {
      f(b, e, chunk);
    } else {
      f(b, e);
    }
  };
  const int nt = num_chunks(n, min_chunk);
  if (nt <= 1) {
    if (n > 0) call(int64_t{0}, n, 0);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int i = omp_get_thread_num(), k = omp_get_num_threads();
    const int64_t b = (n * i / k) / align * align;
    const int64_t e = i + 1 == k ? n : (n * (i + 1) / k) / align * align;
    if (e > b) call(b, e, i);
  }
}

// Splits [0, n) into fixed blocks of `block` elements (the last one shorter), numbered
// 0..ceil(n / block) - 1, and calls f(begin, end, block_index) on each, the blocks shared out
// across the OpenMP team. Unlike parallel_chunks, the blocks do not depend on the thread
// count: a reduction that keeps one partial per block and folds the partials in block order
// gives the same bits on any number of threads (docs/precision.md).
inline int64_t num_blocks(int64_t n, int64_t block) { return n <= 0 ? 0 : (n + block - 1) / block; }
template <class F>
void parallel_blocks(int64_t n, int64_t block, F&& f) {
  block = std::max<int64_t>(block, 1);
  const int64_t nb = num_blocks(n, block);
  const bool par = nb > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < nb; i++) f(i * block, std::min(n, (i + 1) * block), static_cast<int>(i));
}

}  // namespace ops::cpu
