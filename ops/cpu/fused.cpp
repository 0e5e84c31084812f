// [i29: fused] The CPU kernels of fused operators (fused.h).
#include "ops/cpu/fused.h"

#include "ops/cpu/vecmath.h"

namespace ops::cpu {
namespace {

// Columns per block of the backward pass: 256 floats (1 KiB) of dbias stay in L1 while the
// block walks every row, and OC = 3072 gives 12 blocks to share out.
constexpr int64_t kColBlock = 256;

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

void gelu_backward_bias(float* dpre, float* dbias, const float* pre, int64_t N, int64_t OC) {
  parallel_blocks(OC, kColBlock, [=](int64_t c0, int64_t c1, int) {
    gelu_backward_bias_cols(dpre, dbias, pre, N, OC, c0, c1);
  });
}

}  // namespace ops::cpu
