// A small single-threaded GEMM for attention's per-head products.
//
// Attention multiplies many small matrices (one head: T x HS times HS x T, T x T times
// T x HS, ...). Through cblas_sgemm each call pays OpenBLAS's packing of both operands,
// which at K = HS = 64 costs about as much as the multiply (bench/bench_kernels). Here the
// caller packs B once per head into a padded row-major panel, A is read in place through
// arbitrary strides (so A^T costs nothing), and a register-tiled micro-kernel computes
// MR x 32 blocks of C with broadcast-FMAs, the classic BLIS/GotoBLAS inner kernel (Van Zee
// & van de Geijn, "BLIS", TOMS 2015) without the outer packing loops, which matrices this
// small do not need.
//
// Written with GCC vector extensions (16 floats per vector), not intrinsics: on AVX-512 a
// vector is one zmm register, and other targets (AVX2, NEON) still compile, split into
// their native widths.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/cpu/vecmath.h"

namespace ops::cpu {

// C[i, 0:16*NV] (=|+=) alpha * sum_k A(i, k) B[k, 0:16*NV] for i < MR, where A(i, k) =
// A[i*sa_i + k*sa_k]. 2*MR accumulators stay in registers (MR = 6: 12 of 32 zmm).
template <int MR, int NV>
inline __attribute__((always_inline)) void gemm_tile(const float* A, int64_t sa_i, int64_t sa_k, const float* B,
                                                     int64_t ldb, float* C, int64_t ldc, int K, float alpha,
                                                     bool accumulate) {
  vf16 acc[MR][NV];
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < NV; v++) acc[i][v] = vf16{};
  for (int k = 0; k < K; k++) {
    vf16 b[NV];
    for (int v = 0; v < NV; v++) b[v] = load16(B + k * ldb + 16 * v);
    const float* a = A + k * sa_k;
    for (int i = 0; i < MR; i++) {
      const float ai = a[i * sa_i];
      for (int v = 0; v < NV; v++) acc[i][v] += ai * b[v];
    }
  }
  for (int i = 0; i < MR; i++)
    for (int v = 0; v < NV; v++) {
      float* c = C + i * ldc + 16 * v;
      vf16 r = acc[i][v] * alpha;
      if (accumulate) r += load16(c);
      store16(c, r);
    }
}

// C (M x N) (=|+=) alpha * A (M x K) B (K x N). A(i, k) = A[i*sa_i + k*sa_k] (row-major A:
// sa_i = lda, sa_k = 1; A^T of a row-major matrix: sa_i = 1, sa_k = lda). B row-major with
// row stride ldb; C row-major with row stride ldc. N must be a multiple of 16: callers pad
// B's and C's rows (B's padding columns are read, C's are written).
inline void small_gemm(int M, int N, int K, float alpha, const float* A, int64_t sa_i, int64_t sa_k, const float* B,
                       int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  constexpr int MR = 6;
  for (int j0 = 0; j0 < N; j0 += 32) {
    const bool two = N - j0 >= 32;
    const float* Bj = B + j0;
    int i0 = 0;
    for (; i0 + MR <= M; i0 += MR) {
      const float* Ai = A + i0 * sa_i;
      float* Ci = C + i0 * ldc + j0;
      if (two)
        gemm_tile<MR, 2>(Ai, sa_i, sa_k, Bj, ldb, Ci, ldc, K, alpha, accumulate);
      else
        gemm_tile<MR, 1>(Ai, sa_i, sa_k, Bj, ldb, Ci, ldc, K, alpha, accumulate);
    }
    // Remaining rows, one template instance per count so that accumulators stay in registers.
    const float* Ai = A + i0 * sa_i;
    float* Ci = C + i0 * ldc + j0;
#define OPS_TILE_CASE(R)                                                              \
  case R:                                                                             \
    if (two)                                                                          \
      gemm_tile<R, 2>(Ai, sa_i, sa_k, Bj, ldb, Ci, ldc, K, alpha, accumulate);        \
    else                                                                              \
      gemm_tile<R, 1>(Ai, sa_i, sa_k, Bj, ldb, Ci, ldc, K, alpha, accumulate);        \
    break;
    switch (M - i0) {
      OPS_TILE_CASE(1)
      OPS_TILE_CASE(2)
      OPS_TILE_CASE(3)
      OPS_TILE_CASE(4)
      OPS_TILE_CASE(5)
      default:
        break;
    }
#undef OPS_TILE_CASE
  }
}

}  // namespace ops::cpu
