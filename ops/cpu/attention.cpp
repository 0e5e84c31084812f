// Causal multi-head self-attention on the CPU: forward and backward side by side.
//
// Design: one (batch, head) pair is one unit of work; the OpenMP team splits the B*NH
// pairs, and inside a pair every product is a single-threaded cblas_sgemm (OpenBLAS runs
// serially when called inside an active parallel region, so BLAS and our loops share the
// one OpenMP pool). q, k, v are read in place from the packed (B,T,3C) tensor with row
// stride 3C, so nothing is transposed or copied.
//
// Causality is exploited by blocking the query rows: for rows [r0, r1) only keys [0, r1)
// can be attended, so the scores block is (r1-r0) x r1 instead of (r1-r0) x T. That
// skips ~(1 - 1/2 - BQ/2T) of the T^2 products; only the diagonal block wastes work,
// and its upper triangle is overwritten by zeros after the softmax.
//
// Forward (per head, scale = 1/sqrt(HS), Vaswani et al. 2017 eq. 1):
//   S = scale Q K^T;  P = softmax_rows(S) (causal);  Pd = P * M / (1-p);  O = Pd V
// Backward (M is the dropout keep mask, regenerated from the counter RNG with the forward's
// counters offset + ((b*NH + h)*T + t)*T + s):
//   dV += Pd^T dO;  dPd = dO V^T;  dP = dPd * M / (1-p);
//   dS = P * (dP - rowsum(dP * P))   (softmax Jacobian);
//   dQ += scale dS K;  dK += scale dS^T Q.
#include "ops/cpu/attention.h"

#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/vecmath.h"
#include "ops/rng.h"
#include "runner/errors.h"

namespace ops::cpu {

namespace {

int g_block_rows = 64;

// Per-thread scratch, grown on demand and kept for the life of the (persistent) OpenMP
// worker thread, so steady-state training allocates nothing here.
struct Scratch {
  std::vector<float> a, b, c;
};
thread_local Scratch t_scratch;
float* grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// keep[s] = (1/(1-p) if rng_uniform(key, counter0 + s) >= p else 0), s in [0, n).
OPS_INLINE void dropout_factors(float* keep, int n, uint64_t key, uint64_t counter0, float p, float kscale) {
#pragma omp simd
  for (int s = 0; s < n; s++) keep[s] = rng_uniform(key, counter0 + static_cast<uint64_t>(s)) >= p ? kscale : 0.0f;
}

// Causal softmax of one score row in place: row[0..n) -> probabilities, row[n..len) -> 0.
OPS_INLINE void softmax_causal_row(float* row, int n, int len) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int s = 0; s < n; s++) mx = row[s] > mx ? row[s] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int s = 0; s < n; s++) {
    float e = exp_f(row[s] - mx);
    row[s] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
#pragma omp simd
  for (int s = 0; s < n; s++) row[s] *= inv;
  for (int s = n; s < len; s++) row[s] = 0.0f;
}

// One (b, h) pair. q, k, v: (T, HS) views with row stride 3C; o: (T, HS) view with row
// stride C; P: (T, T) contiguous. counter0 = (b*NH + h) * T; the dropout counter of (t, s) is
// drop.offset + (counter0 + t) * T + s.
void forward_head(float* o, float* P, const float* q, const float* k, const float* v, int T, int C, int HS,
                  DropoutSpec drop, uint64_t counter0) {
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool dropout = drop.p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int BQ = g_block_rows;
  for (int r0 = 0; r0 < T; r0 += BQ) {
    const int r1 = std::min(T, r0 + BQ), m = r1 - r0;
    float* Pb = P + static_cast<size_t>(r0) * T;
    // S[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T        (m, r1)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, HS, scale, q + static_cast<size_t>(r0) * C3, C3, k,
                C3, 0.0f, Pb, T);
    for (int t = r0; t < r1; t++) softmax_causal_row(P + static_cast<size_t>(t) * T, t + 1, T);
    // A = P (or P * M / (1-p)) for the rows of this block, as an (m, r1) matrix.
    const float* A = Pb;
    int lda = T;
    if (dropout) {
      float* Pd = grow(t_scratch.a, static_cast<size_t>(m) * r1);
      for (int t = r0; t < r1; t++) {
        float* pd = Pd + static_cast<size_t>(t - r0) * r1;
        const float* p = P + static_cast<size_t>(t) * T;
        dropout_factors(pd, t + 1, drop.key, drop.offset + (counter0 + t) * T, drop.p, kscale);
#pragma omp simd
        for (int s = 0; s <= t; s++) pd[s] *= p[s];
        for (int s = t + 1; s < r1; s++) pd[s] = 0.0f;
      }
      A = Pd;
      lda = r1;
    }
    // O[r0:r1] = A V[0:r1]                              (m, HS)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, r1, 1.0f, A, lda, v, C3, 0.0f,
                o + static_cast<size_t>(r0) * C, C);
  }
}

// One (b, h) pair of the backward. dq, dk, dv: views into dqkv (row stride 3C), dO: view
// into dout (row stride C), P: (T, T) saved probabilities.
void backward_head(float* dq, float* dk, float* dv, const float* dO, const float* q, const float* k, const float* v,
                   const float* P, int T, int C, int HS, DropoutSpec drop, uint64_t counter0) {
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool dropout = drop.p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int BQ = g_block_rows;
  for (int r0 = 0; r0 < T; r0 += BQ) {
    const int r1 = std::min(T, r0 + BQ), m = r1 - r0;
    const float* Pb = P + static_cast<size_t>(r0) * T;
    const float* dOb = dO + static_cast<size_t>(r0) * C;
    // Keep factors M and Pd = P * M for this block, both (m, r1).
    const float* A = Pb;
    int lda = T;
    float* M = nullptr;
    if (dropout) {
      M = grow(t_scratch.b, static_cast<size_t>(m) * r1);
      float* Pd = grow(t_scratch.a, static_cast<size_t>(m) * r1);
      for (int t = r0; t < r1; t++) {
        float* mk = M + static_cast<size_t>(t - r0) * r1;
        float* pd = Pd + static_cast<size_t>(t - r0) * r1;
        const float* p = P + static_cast<size_t>(t) * T;
        dropout_factors(mk, t + 1, drop.key, drop.offset + (counter0 + t) * T, drop.p, kscale);
#pragma omp simd
        for (int s = 0; s <= t; s++) pd[s] = p[s] * mk[s];
        for (int s = t + 1; s < r1; s++) pd[s] = 0.0f;
      }
      A = Pd;
      lda = r1;
    }
    // dV[0:r1] += Pd[r0:r1, 0:r1]^T dO[r0:r1]              (r1, HS)
    if (dv) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m, 1.0f, A, lda, dOb, C, 1.0f, dv, C3);
    if (!dq && !dk) continue;
    // dPd[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T                (m, r1)
    float* dS = grow(t_scratch.c, static_cast<size_t>(m) * r1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, HS, 1.0f, dOb, C, v, C3, 0.0f, dS, r1);
    // dS = P * (dP - rowsum(dP * P)), dP = dPd * M; zero above the diagonal.
    for (int t = r0; t < r1; t++) {
      float* ds = dS + static_cast<size_t>(t - r0) * r1;
      const float* p = P + static_cast<size_t>(t) * T;
      const int n = t + 1;
      if (dropout) {
        const float* mk = M + static_cast<size_t>(t - r0) * r1;
#pragma omp simd
        for (int s = 0; s < n; s++) ds[s] *= mk[s];
      }
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int s = 0; s < n; s++) dot += ds[s] * p[s];
#pragma omp simd
      for (int s = 0; s < n; s++) ds[s] = p[s] * (ds[s] - dot);
      for (int s = n; s < r1; s++) ds[s] = 0.0f;
    }
    // dQ[r0:r1] += scale dS K[0:r1]                          (m, HS)
    if (dq)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, r1, scale, dS, r1, k, C3, 1.0f,
                  dq + static_cast<size_t>(r0) * C3, C3);
    // dK[0:r1] += scale dS^T Q[r0:r1]                        (r1, HS)
    if (dk)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m, scale, dS, r1,
                  q + static_cast<size_t>(r0) * C3, C3, 1.0f, dk, C3);
  }
}

void check_shapes(int B, int T, int C, int NH, DropoutSpec drop) {
  RUNNER_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0,
               "attention: bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" +
                   std::to_string(C) + " NH=" + std::to_string(NH) + " (C must be a multiple of NH)");
  RUNNER_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "attention: dropout p must be in [0, 1), got " + std::to_string(drop.p));
}

}  // namespace

int attention_block_rows() { return g_block_rows; }
void set_attention_block_rows(int rows) { g_block_rows = rows > 0 ? rows : 64; }

// out: (B,T,C), probs: (B,NH,T,T), qkv: (B,T,3C)
void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH, DropoutSpec drop) {
  check_shapes(B, T, C, NH, drop);
  const int HS = C / NH, BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const float* q = qkv + static_cast<size_t>(b) * T * 3 * C + static_cast<size_t>(h) * HS;
    float* o = out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS;
    float* P = probs + static_cast<size_t>(bh) * T * T;
    forward_head(o, P, q, q + C, q + 2 * C, T, C, HS, drop, static_cast<uint64_t>(bh) * T);
  }
}

// dqkv: (B,T,3C) +=, dout: (B,T,C), qkv: (B,T,3C), probs: (B,NH,T,T)
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int B, int T, int C,
                        int NH, DropoutSpec drop) {
  if (!dqkv) return;
  check_shapes(B, T, C, NH, drop);
  const int HS = C / NH, BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const size_t qoff = static_cast<size_t>(b) * T * 3 * C + static_cast<size_t>(h) * HS;
    const float* q = qkv + qoff;
    float* dq = dqkv + qoff;
    const float* dO = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS;
    const float* P = probs + static_cast<size_t>(bh) * T * T;
    backward_head(dq, dq + C, dq + 2 * C, dO, q, q + C, q + 2 * C, P, T, C, HS, drop,
                  static_cast<uint64_t>(bh) * T);
  }
}

}  // namespace ops::cpu
