// The CPU kernels of fused operators (fused.h).
#include "ops/cpu/fused.h"

#include <algorithm>

#include "ops/cpu/vecmath.h"

namespace ops::cpu {
namespace {

// Fewest columns per thread in the backward pass: below ~16K elements of work a parallel
// region does not pay (cpu_backend.cpp's kGrainStream), and 16 columns are one AVX-512 vector.
constexpr int64_t kGrainStream = 1 << 14;

// Columns [c0, c1) of every row. `0.0f +` reproduces the unfused gradient exactly: GELU's
// backward accumulates into a zeroed buffer, which turns a -0 product into +0.
void gelu_backward_bias_cols(float* __restrict dpre, float* __restrict dbias, const float* __restrict pre, int64_t N,
                             int64_t OC, int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < N; r++) {
    float* d = dpre + r * OC;
    const float* x = pre + r * OC;
    if (dbias) {
#pragma omp simd
      for (int64_t j = c0; j < c1; j++) {
        const float v = 0.0f + d[j] * gelu_grad_f(x[j]);
        d[j] = v;
        dbias[j] += v;
      }
    } else {
#pragma omp simd
      for (int64_t j = c0; j < c1; j++) d[j] = 0.0f + d[j] * gelu_grad_f(x[j]);
    }
  }
}

}  // namespace

// Threads own columns: each column's sum runs over all rows in order whichever thread runs it,
// so an even split per thread (parallel_chunks, best balanced) gives the same bits on any
// thread count; a fixed blocking would only add imbalance (3 blocks of 256 over 2 threads).
void gelu_backward_bias(float* dpre, float* dbias, const float* pre, int64_t N, int64_t OC) {
  parallel_chunks(OC, std::max<int64_t>(16, kGrainStream / std::max<int64_t>(N, 1)), [=](int64_t c0, int64_t c1) {
    gelu_backward_bias_cols(dpre, dbias, pre, N, OC, c0, c1);
  });
}

}  // namespace ops::cpu
