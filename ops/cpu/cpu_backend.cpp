// The CPU backend: every kernel of ops/backend.h, forward and backward side by side.
//
// GEMMs go to OpenBLAS (its OpenMP build, so BLAS and these loops share one thread pool);
// attention lives in attention.cpp. Everything else is a plain loop that GCC vectorizes
// (`#pragma omp simd`, and vecmath.h's exp_f instead of libm's scalar expf).
//
// Structure: each operator is a pair of free "range kernels" (forward, backward) that take
// plain pointers and a range of rows or elements, followed at the bottom by the Backend
// class, which only splits the range across the OpenMP team (parallel_chunks) when the
// work repays a parallel region. Keeping the loops out of the lambdas matters: inside a
// lambda GCC reloads captured variables on every iteration of a simd reduction and gives up
// vectorizing it.
//
// Conventions (ops/backend.h): every backward accumulates (+=) into its gradients except
// softmax_xent_backward and xent_shard_backward, which overwrite; a null gradient pointer
// skips that work.
#include <cblas.h>
#include <omp.h>
#include <strings.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/backend_fp32.h"
#include "ops/convert.h"
#include "ops/cpu/adamw.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/dnnl_gemm.h"
#include "ops/cpu/fused.h"
#include "ops/cpu/vecmath.h"
#include "ops/rng.h"
#include "ops/check.h"
#include "ops/cpu/native16.h"

namespace ops {
namespace cpu {
namespace {

// Minimum elements per thread before a loop goes parallel: ~64 KiB of streaming per thread
// takes about as long as waking a passive OpenMP worker.
constexpr int64_t kGrainStream = 1 << 14;
// The same for loops that spend ~10+ flops per element (exp, sqrt, division, hashing).
constexpr int64_t kGrainMath = 1 << 12;

// Rows per chunk so that each chunk of a (rows, C) tensor has at least `grain` elements.
int64_t row_grain(int64_t C, int64_t grain) { return std::max<int64_t>(1, grain / std::max<int64_t>(C, 1)); }

// Rows per block of a reduction over rows (a norm's dweight, dbias): fixed by the width
// alone, never by the thread count (parallel_blocks), and at least 64 rows so that folding
// the per-block partials costs under 1/32 of a pass over the tensor.
int64_t reduce_block_rows(int64_t C) { return std::max<int64_t>(64, row_grain(C, kGrainStream)); }

// Per-block partial sums of a reduction over rows (dweight, dbias), folded into dst after in
// block order: the blocks are parallel_blocks' fixed ones, so the result is the same bits on
// any number of threads.
struct Partials {
  std::vector<float> buf;
  int blocks = 1;
  int64_t width = 0;
  Partials(int blocks_, int64_t width_) : blocks(blocks_), width(width_) {
    buf.assign(static_cast<size_t>(blocks) * width, 0.0f);
  }
  float* slot(int i) { return buf.data() + static_cast<size_t>(i) * width; }
  // dst[j] += sum over blocks (in block order) of slot[off + j], j in [0, n); the threads
  // split the columns, each column's sum keeps its order.
  void fold(float* dst, int64_t off, int64_t n) {
    if (!dst) return;
    const float* base = buf.data() + off;
    const int nb = blocks;
    const int64_t w = width;
    parallel_chunks(n, std::max<int64_t>(16, kGrainStream / std::max(nb, 1)), [=](int64_t c0, int64_t c1) {
      for (int i = 0; i < nb; i++) {
        const float* s = base + static_cast<size_t>(i) * w;
#pragma omp simd
        for (int64_t j = c0; j < c1; j++) dst[j] += s[j];
      }
    });
  }
};

// C (M,N) = beta C + op(A) (M,K) op(B) (K,N), row-major, through OpenBLAS, with the same bits
// on any thread count. OpenBLAS blocks K in GEMM_Q-sized panels, but when what is left of K
// lies in (Q, 2Q) its single-threaded driver (level3.c) halves it rounded to GEMM_UNROLL_M and
// its threaded one (level3_thread.c) halves it exactly: for most K the two sum C's elements in
// different panels (K = 773 does; tests/test_ops_threads.cpp). Q is a multiple of 64 and
// UNROLL_M divides 32 on OpenBLAS's x86 cores, so a K that is a multiple of 64 is cut the same
// way by both; the remaining K % 64 (< Q) goes in a second call, one panel in both drivers.
// GPT shapes (widths and row counts multiples of 64) make one call, as before.
void sgemm_fixed_k(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
                   float beta, float* C, int ldc) {
  const CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
  const int k64 = K / 64 * 64;
  if (k64 > 0) cblas_sgemm(CblasRowMajor, oa, ob, M, N, k64, 1.0f, A, lda, B, ldb, beta, C, ldc);
  if (K > k64 || K == 0) {
    const float* a = ta ? A + static_cast<size_t>(k64) * lda : A + k64;  // op(A)'s columns from k64 on
    const float* b = tb ? B + k64 : B + static_cast<size_t>(k64) * ldb;  // op(B)'s rows from k64 on
    cblas_sgemm(CblasRowMajor, oa, ob, M, N, K - k64, 1.0f, a, lda, b, ldb, k64 > 0 ? 1.0f : beta, C, ldc);
  }
}

// dweight (M,C) += dout^T @ inp, the 16-bit weight gradient through oneDNN, with the same bits
// on any thread count. oneDNN's matmul splits a GEMM whose M x N is small against its long K
// (here K = the rows, M x N the weight) across threads along K and sums the threads' partials:
// the result depends on the thread count (tests/test_ops_threads.cpp). So the split is ours and
// fixed by the shape alone: 2-D tiles of the weight, each one single-threaded oneDNN call over
// the whole K (a thread count of 1 inside the tile: no split, no partials to fold), the tiles
// shared out across the team. kTiles = 12 tiles where the weight allows (an even share for 1, 2,
// 3, 4, 6 or 12 threads): weight rows in the fewest of 1, 2, 3, 4, 6 or 12 groups that keeps
// them at most 256 rows, then columns in groups of at least 128 to make up 12; a weight too
// tall for 12 groups of 256 rows (a vocabulary) gets 12, 24, 36 or 48 row groups, each tile
// repacking the whole inp. Measured (bench_kernels --dweight, bench/thread_cost.py, 2 threads):
// as fast as oneDNN's own split on bench/train_vs_torch.py's small configuration and faster
// on GPT-2 124M (the lm head's 50257 rows: 48 vs 65 ms); the 1-D tiles of 256 rows this
// replaces (K cut into summed panels when fewer than four) cost 3% of a bf16 step.
// dout: (K,M) stored, inp: (K,C), both of dtype t.
void dnnl_dweight_fixed(float* dweight, const void* dout, const void* inp, DType t, int K, int C, int M) {
  constexpr int kTiles = 12, kMaxRows = 256, kMinCols = 128, kMaxRowGroups = 4 * kTiles;
  if (M <= 0 || C <= 0 || K <= 0) return;  // nothing to add
  int nm = 0;
  for (int d = 1; d <= kTiles && !nm; ++d)
    if (kTiles % d == 0 && (M + d - 1) / d <= kMaxRows) nm = d;
  if (!nm) nm = std::min((M + kMaxRows - 1) / kMaxRows, kMaxRowGroups) / kTiles * kTiles;
  const int mr = ((M + nm - 1) / nm + 15) / 16 * 16;  // rows per tile, a multiple of 16
  nm = (M + mr - 1) / mr;
  int nc = nm >= kTiles ? 1 : std::max(1, std::min((kTiles + nm - 1) / nm, C / kMinCols));
  const int cw = ((C + nc - 1) / nc + 15) / 16 * 16;  // columns per tile
  nc = (C + cw - 1) / cw;
  const auto* d16 = static_cast<const uint16_t*>(dout);
  const auto* x16 = static_cast<const uint16_t*>(inp);
  parallel_blocks(int64_t{nm} * nc, 1, [=](int64_t u, int64_t, int) {
    const int mi = static_cast<int>(u / nc), ci = static_cast<int>(u % nc);
    const int m0 = mi * mr, m1 = std::min(M, m0 + mr), c0 = ci * cw, c1 = std::min(C, c0 + cw);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);  // oneDNN fixes its split for the count it sees: one thread, no split
    dnnl_gemm(t, true, false, m1 - m0, c1 - c0, K, d16 + m0, M, x16 + c0, C, nullptr, true,
              dweight + static_cast<size_t>(m0) * C + c0, C);
    omp_set_num_threads(saved);
  });
}

// Rows [0, M) of out = A (M,K) @ op(B), 16-bit operands through oneDNN, with the same bits on
// any thread count: the forward and the input gradient. oneDNN may split a GEMM's reduction
// across threads and sum the partials, and does on CPUs with AMX (its brgemm kernels cut K =
// 1100 at 2 and 3 threads: tests/test_ops_threads.cpp), so the split is ours and fixed by the
// shape alone, as for dnnl_dweight_fixed: up to kTiles row tiles of a multiple of 16 rows
// (an even share for 1, 2, 3, 4, 6 or 12 threads), each one single-threaded oneDNN call over
// the whole K, the tiles shared out across the team. A: (M,K) stored, row-major, of dtype t.
void dnnl_rows_fixed(DType t, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
                     const float* bias, bool accumulate, float* C, int ldc) {
  constexpr int kTiles = 12;
  if (M <= 0 || N <= 0) return;  // no output
  const int mr = ((M + kTiles - 1) / kTiles + 15) / 16 * 16;
  const int nm = (M + mr - 1) / mr;
  const auto* a16 = static_cast<const uint16_t*>(A);
  parallel_blocks(nm, 1, [=](int64_t u, int64_t, int) {
    const int m0 = static_cast<int>(u) * mr, m1 = std::min(M, m0 + mr);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);  // oneDNN fixes its split for the count it sees: one thread, no split
    dnnl_gemm(t, false, trans_b, m1 - m0, N, K, a16 + static_cast<size_t>(m0) * lda, lda, B, ldb, bias, accumulate,
              C + static_cast<size_t>(m0) * ldc, ldc);
    omp_set_num_threads(saved);
  });
}

// =============================================================================== embedding
// A vocabulary shard holds rows [vstart, vstart + Vlocal) of the token table; the unsharded
// table is the shard vstart = 0, Vlocal = INT_MAX. wte_row(token) is the token's row in this
// shard, or null when another shard owns it.
template <class F>
inline F* wte_row(F* wte, int32_t token, int vstart, int Vlocal, int C) {
  const int64_t local = static_cast<int64_t>(token) - vstart;
  return local >= 0 && local < Vlocal ? wte + local * C : nullptr;
}
// out[r] = wte[tokens[r]] (0 for a token of another shard) + wpe[r % T], rows r in [r0, r1).
// out: (N,C), wte: (Vlocal,C), wpe: (maxT,C) or null
void embedding_forward_rows(float* __restrict out, const int32_t* tokens, const float* __restrict wte,
                            const float* __restrict wpe, int64_t r0, int64_t r1, int T, int C, int vstart,
                            int Vlocal) {
  for (int64_t r = r0; r < r1; r++) {
    float* o = out + r * C;
    const float* w = wte_row(wte, tokens[r], vstart, Vlocal, C);
    const float* p = wpe ? wpe + (r % T) * C : nullptr;
    if (w && p) {
#pragma omp simd
      for (int i = 0; i < C; i++) o[i] = w[i] + p[i];
    } else if (w || p) {
      std::memcpy(o, w ? w : p, sizeof(float) * C);
    } else {
      std::memset(o, 0, sizeof(float) * C);
    }
  }
}
// dwte[tokens[r]] += dout[r] (tokens of this shard only), dwpe[r % T] += dout[r] over all N
// rows, channels [c0, c1) only: tokens repeat, so threads split the channels, never the rows.
void embedding_backward_cols(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t N,
                             int T, int C, int vstart, int Vlocal, int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < N; r++) {
    const float* d = dout + r * C;
    if (dwte) {
      if (float* w = wte_row(dwte, tokens[r], vstart, Vlocal, C)) {
#pragma omp simd
        for (int64_t i = c0; i < c1; i++) w[i] += d[i];
      }
    }
    if (dwpe) {
      float* p = dwpe + (r % T) * C;
#pragma omp simd
      for (int64_t i = c0; i < c1; i++) p[i] += d[i];
    }
  }
}

// =============================================================================== layernorm
// Ba, Kiros & Hinton 2016: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var
// biased. inp, out: (N,C); weight, bias: (C) (never null here); mean, rstd: (N) or null.
void layernorm_forward_rows(float* __restrict out, float* mean, float* rstd, const float* __restrict inp,
                            const float* __restrict weight, const float* __restrict bias, int64_t r0, int64_t r1,
                            int C, float eps) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    float* o = out + r * C;
    // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
    // catastrophically in fp32 when |mean| >> std.
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++) s += x[i];
    const float m = s / C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    const float rs = 1.0f / std::sqrt(v / C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * rs * weight[i] + bias[i];
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}
// With xhat = (x - mean) rstd and g = w * dout (per row):
//   dx += rstd (g - mean(g) - xhat mean(g xhat)),  dw += sum_rows dout xhat,  db += sum_rows dout.
// dinp: (N,C) or null; pw, pb: (C) this chunk's partial dweight/dbias or null.
void layernorm_backward_rows(float* __restrict dinp, float* __restrict pw, float* __restrict pb,
                             const float* __restrict dout, const float* __restrict inp, const float* __restrict weight,
                             const float* mean, const float* rstd, int64_t r0, int64_t r1, int C) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    const float m = mean[r], rs = rstd[r];
    if (dinp) {
      float g_mean = 0.0f, gx_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gx_mean)
      for (int i = 0; i < C; i++) {
        const float g = weight[i] * dy[i];
        g_mean += g;
        gx_mean += g * (x[i] - m) * rs;
      }
      g_mean /= C;
      gx_mean /= C;
      float* dx = dinp + r * C;
#pragma omp simd
      for (int i = 0; i < C; i++) dx[i] += rs * (weight[i] * dy[i] - g_mean - (x[i] - m) * rs * gx_mean);
    }
    if (pw) {
#pragma omp simd
      for (int i = 0; i < C; i++) pw[i] += dy[i] * (x[i] - m) * rs;
    }
    if (pb) {
#pragma omp simd
      for (int i = 0; i < C; i++) pb[i] += dy[i];
    }
  }
}

// =============================================================================== rmsnorm
// Zhang & Sennrich 2019: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward_rows(float* __restrict out, float* rstd, const float* __restrict inp,
                          const float* __restrict weight, int64_t r0, int64_t r1, int C, float eps) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    float* o = out + r * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < C; i++) ss += x[i] * x[i];
    const float rs = 1.0f / std::sqrt(ss / C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = x[i] * rs * weight[i];
    if (rstd) rstd[r] = rs;
  }
}
// With xhat = x rstd and g = w dout: dx += rstd (g - xhat mean(g xhat)), dw += sum_rows dout xhat.
void rmsnorm_backward_rows(float* __restrict dinp, float* __restrict pw, const float* __restrict dout,
                           const float* __restrict inp, const float* __restrict weight, const float* rstd, int64_t r0,
                           int64_t r1, int C) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    const float rs = rstd[r];
    if (dinp) {
      float gx_mean = 0.0f;
#pragma omp simd reduction(+ : gx_mean)
      for (int i = 0; i < C; i++) gx_mean += weight[i] * dy[i] * x[i] * rs;
      gx_mean /= C;
      float* dx = dinp + r * C;
#pragma omp simd
      for (int i = 0; i < C; i++) dx[i] += rs * (weight[i] * dy[i] - x[i] * rs * gx_mean);
    }
    if (pw) {
#pragma omp simd
      for (int i = 0; i < C; i++) pw[i] += dy[i] * x[i] * rs;
    }
  }
}

// =============================================================================== matmul (bias part)
// out[r] = bias for rows [r0, r1) of (N,OC): the GEMM then accumulates into it (beta = 1).
void bias_fill_rows(float* __restrict out, const float* __restrict bias, int64_t r0, int64_t r1, int OC) {
  for (int64_t r = r0; r < r1; r++) std::memcpy(out + r * OC, bias, sizeof(float) * OC);
}
// dbias[j] += sum over all N rows of dout[r, j], columns [c0, c1) only (threads own columns).
void bias_backward_cols(float* __restrict dbias, const float* __restrict dout, int64_t N, int OC, int64_t c0,
                        int64_t c1) {
  for (int64_t r = 0; r < N; r++) {
    const float* d = dout + r * OC;
#pragma omp simd
    for (int64_t j = c0; j < c1; j++) dbias[j] += d[j];
  }
}

// dbias[j] += sum over all N rows of dout[r, j] with dout in 16-bit dtype t, columns [c0, c1):
// each row's slice is widened into a stack buffer first (fp32 sums, like the fp32 kernel).
void bias_backward_cols16(float* __restrict dbias, const uint16_t* dout, DType t, int64_t N, int OC, int64_t c0,
                          int64_t c1) {
  constexpr int64_t kChunk = 1024;
  float row[kChunk];
  for (int64_t a = c0; a < c1; a += kChunk) {
    const int64_t m = std::min(kChunk, c1 - a);
    for (int64_t r = 0; r < N; r++) {
      to_f32(row, dout + r * OC + a, t, m);
#pragma omp simd
      for (int64_t j = 0; j < m; j++) dbias[a + j] += row[j];
    }
  }
}

// =============================================================================== rope
// Su et al. 2021 (RoFormer), "rotate half" pairing (i, i + HS/2), angle t * theta^(-2i/HS).
// Rows [r0, r1) of (B*T, W), W = (NH + 2 NKV) HS: the NH q heads and NKV k heads rotated by +a
// (forward, overwrite) or by -a (backward: a rotation's adjoint is its inverse, accumulate); v
// copied or accumulated. cos_tab, sin_tab: (T, HS/2). dst may alias src in the forward.
void rope_rows(float* dst, const float* src, const float* cos_tab, const float* sin_tab, int64_t r0, int64_t r1,
               int T, int HS, int NH, int NKV, bool inverse) {
  const int half = HS / 2, W = (NH + 2 * NKV) * HS, Cv = NKV * HS;
  const float sgn = inverse ? -1.0f : 1.0f;
  for (int64_t r = r0; r < r1; r++) {
    const int t = static_cast<int>(r % T);
    const float* cs = cos_tab + static_cast<size_t>(t) * half;
    const float* sn = sin_tab + static_cast<size_t>(t) * half;
    const float* x = src + r * W;
    float* y = dst + r * W;
    for (int hh = 0; hh < NH + NKV; hh++) {  // q heads, then k heads
      const float* x1 = x + hh * HS;
      const float* x2 = x1 + half;
      float* y1 = y + hh * HS;
      float* y2 = y1 + half;
      if (inverse) {
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float a = x1[i], b = x2[i], s = sgn * sn[i];
          y1[i] += a * cs[i] - b * s;
          y2[i] += b * cs[i] + a * s;
        }
      } else {
#pragma omp simd
        for (int i = 0; i < half; i++) {
          const float a = x1[i], b = x2[i], s = sn[i];
          y1[i] = a * cs[i] - b * s;
          y2[i] = b * cs[i] + a * s;
        }
      }
    }
    const float* xv = x + W - Cv;
    float* yv = y + W - Cv;
    if (inverse) {
#pragma omp simd
      for (int i = 0; i < Cv; i++) yv[i] += xv[i];
    } else if (yv != xv) {
      std::memcpy(yv, xv, sizeof(float) * Cv);
    }
  }
}

// =============================================================================== activations
// The activations (OPS_ACTIVATIONS, ops/kernels.h), each from its formula in vecmath.h:
// out = f(x); d(inp) += d(out) f'(x), accumulated.
template <class F>
void activation_forward_range(float* __restrict out, const float* __restrict inp, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = f(inp[i]);
}
template <class DF>
void activation_backward_range(float* __restrict dinp, const float* __restrict inp, const float* __restrict dout,
                               int64_t n, DF df) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dinp[i] += dout[i] * df(inp[i]);
}
// The entries of one activation: F32 from its formula, BF16/F16 from its native16 kernels.
using Native16Forward = void (*)(Backend&, void*, const void*, DType, int64_t);
using Native16Backward = void (*)(Backend&, void*, const void*, const void*, DType, int64_t);

// =============================================================================== swiglu
// Shazeer 2020. inp: (N, 2H) = [gate | up], out: (N, H) = silu(gate) * up, silu(g) = g s,
// s = sigmoid(g), silu'(g) = s (1 + g (1 - s)).
void swiglu_forward_rows(float* __restrict out, const float* __restrict inp, int64_t r0, int64_t r1, int H) {
  for (int64_t r = r0; r < r1; r++) {
    const float* g = inp + r * 2 * H;
    const float* u = g + H;
    float* o = out + r * H;
#pragma omp simd
    for (int i = 0; i < H; i++) o[i] = g[i] * sigmoid_f(g[i]) * u[i];
  }
}
void swiglu_backward_rows(float* __restrict dinp, const float* __restrict dout, const float* __restrict inp,
                          int64_t r0, int64_t r1, int H) {
  for (int64_t r = r0; r < r1; r++) {
    const float* g = inp + r * 2 * H;
    const float* u = g + H;
    const float* dy = dout + r * H;
    float* dg = dinp + r * 2 * H;
    float* du = dg + H;
#pragma omp simd
    for (int i = 0; i < H; i++) {
      const float s = sigmoid_f(g[i]);
      dg[i] += dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
      du[i] += dy[i] * g[i] * s;
    }
  }
}

// =============================================================================== add, scale
// out may alias a or b (same index only), so no __restrict.
void add_range(float* out, const float* a, const float* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
void add_inplace_range(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
// AddNorm's backward on elements [off, off + n): the total d(sum) into d(a) and
// d(b) (either may be null), add_inplace's arithmetic.
void add_total_rows(float* da, float* db, const float* dsum, int64_t off, int64_t n) {
  if (da) add_inplace_range(da + off, dsum + off, n);
  if (db) add_inplace_range(db + off, dsum + off, n);
}
// The fp32 forward of AddLayerNorm and AddRMSNorm: per chunk of rows the Add's
// pass into SUM, then NORM_ROWS(sum, r0, r1) over the rows just written (still in cache).
template <class NormRows>
void add_norm_forward_chunks(void* sum, const void* a, const void* b, int N, int C, NormRows norm_rows) {
  float* s = static_cast<float*>(sum);
  const float* pa = static_cast<const float*>(a);
  const float* pb = static_cast<const float*>(b);
  parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
    add_range(s + r0 * C, pa + r0 * C, pb + r0 * C, (r1 - r0) * C);
    norm_rows(s, r0, r1);
  }, 1);
}
// The fp32 backward of AddLayerNorm and AddRMSNorm over fixed row blocks:
// NORM_ROWS(dsum, slot, r0, r1) writes d(sum) of rows [r0, r1) and the block's parameter
// gradients into its slot (SLOT_ROWS x C floats), then the add passes d(sum) on to d(a) and
// d(b). The caller folds the slots in block order: thread-independent.
template <class NormRows>
Partials add_norm_backward_blocks(void* da, void* db, void* dsum, int N, int C, int slot_rows, NormRows norm_rows) {
  float* ds = static_cast<float*>(dsum);
  float* pa = static_cast<float*>(da);
  float* pb = static_cast<float*>(db);
  const int64_t block = reduce_block_rows(C);
  Partials part(static_cast<int>(num_blocks(N, block)), static_cast<int64_t>(slot_rows) * C);
  Partials* pp = &part;
  parallel_blocks(N, block, [=](int64_t r0, int64_t r1, int blk) {
    norm_rows(ds, pp->slot(blk), r0, r1);
    add_total_rows(pa, pb, ds, r0 * C, (r1 - r0) * C);
  });
  return part;
}
void scale_range(float* x, int64_t n, float s) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

// =============================================================================== dropout
// Inverted dropout (Srivastava et al. 2014, scaled at train time): element i (its global
// index, i0 + local) keeps iff rng_uniform(key, offset + i) >= p and is then scaled by 1/(1-p).
void dropout_forward_range(float* out, const float* inp, int64_t i0, int64_t i1, uint64_t key, uint64_t offset,
                           float p, float scale) {
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) out[i] = rng_uniform(key, offset + static_cast<uint64_t>(i)) >= p ? inp[i] * scale : 0.0f;
}
void dropout_backward_range(float* __restrict dinp, const float* __restrict dout, int64_t i0, int64_t i1,
                            uint64_t key, uint64_t offset, float p, float scale) {
#pragma omp simd
  for (int64_t i = i0; i < i1; i++)
    dinp[i] += rng_uniform(key, offset + static_cast<uint64_t>(i)) >= p ? dout[i] * scale : 0.0f;
}

// =============================================================================== softmax cross-entropy
// Rows [r0, r1) of (N,V): probs = softmax(logits[:, :Vreal]) (padding columns -> 0) and
// loss = logsumexp(x) - x[target] = log(sum exp(x - max)) - (x[target] - max), or 0 when the
// target is negative. probs may alias logits.
void softmax_xent_forward_rows(float* losses, float* probs, const float* logits, const int32_t* targets, int64_t r0,
                               int64_t r1, int V, int Vreal) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = logits + r * V;
    float* p = probs + r * V;
    const int tgt = targets[r];
    OPS_CHECK(tgt < Vreal, "softmax_xent: target " + std::to_string(tgt) + " >= Vreal " + std::to_string(Vreal));
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < Vreal; i++) mx = x[i] > mx ? x[i] : mx;
    const float xt = tgt >= 0 ? x[tgt] : 0.0f;  // read before p (which may alias x) is written
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < Vreal; i++) {
      const float e = exp_f(x[i] - mx);
      p[i] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int i = 0; i < Vreal; i++) p[i] *= inv;
    for (int i = Vreal; i < V; i++) p[i] = 0.0f;
    losses[r] = tgt >= 0 ? std::log(sum) - (xt - mx) : 0.0f;
  }
}
// dlogits = (probs - onehot(target - vstart)) * dloss, OVERWRITTEN, rows [r0, r1); may alias
// probs. Ignored rows and padding columns get 0; a target outside [vstart, vstart + Vreal)
// (another vocabulary shard's) has no one-hot term here. The unsharded kernel is vstart = 0.
void softmax_xent_backward_rows(float* dlogits, const float* probs, const int32_t* targets, float dloss, int64_t r0,
                                int64_t r1, int V, int Vreal, int vstart) {
  for (int64_t r = r0; r < r1; r++) {
    const float* p = probs + r * V;
    float* d = dlogits + r * V;
    const int tgt = targets[r];
    if (tgt < 0) {
      std::memset(d, 0, sizeof(float) * V);
      continue;
    }
#pragma omp simd
    for (int i = 0; i < Vreal; i++) d[i] = p[i] * dloss;
    for (int i = Vreal; i < V; i++) d[i] = 0.0f;
    const int64_t local = static_cast<int64_t>(tgt) - vstart;
    if (local >= 0 && local < Vreal) d[local] -= dloss;
  }
}

// ---- vocabulary-parallel softmax cross-entropy (Megatron-LM, Shoeybi et al. 2019) ----
// The three forward phases of softmax_xent_forward_rows on a column shard of the logits
// (V columns, the first Vreal real), with the caller reducing over the shards in between.
// A target owned by this shard must be a real column: a padding column is an error.
inline int64_t shard_target(int tgt, int vstart, int V, int Vreal) {
  const int64_t local = static_cast<int64_t>(tgt) - vstart;
  OPS_CHECK(!(local >= Vreal && local < V), "xent_shard: target " + std::to_string(tgt) +
                                                   " is a padding column of the shard starting at " +
                                                   std::to_string(vstart));
  return tgt >= 0 && local >= 0 && local < Vreal ? local : -1;
}
// Phase 1: rowmax[r] = max of the real columns (-inf when Vreal == 0).
void xent_shard_max_rows(float* rowmax, const float* logits, int64_t r0, int64_t r1, int V, int Vreal) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = logits + r * V;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < Vreal; i++) mx = x[i] > mx ? x[i] : mx;
    rowmax[r] = mx;
  }
}
// Phase 2: sumexp[r] = sum exp(x - rowmax) over the real columns; tlogit[r] = x[target] -
// rowmax when this shard owns the target, else 0.
void xent_shard_sumexp_rows(float* sumexp, float* tlogit, const float* logits, const float* rowmax,
                            const int32_t* targets, int64_t r0, int64_t r1, int V, int Vreal, int vstart) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = logits + r * V;
    const float mx = rowmax[r];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < Vreal; i++) sum += exp_f(x[i] - mx);
    sumexp[r] = sum;
    const int64_t t = shard_target(targets[r], vstart, V, Vreal);
    tlogit[r] = t >= 0 ? x[t] - mx : 0.0f;
  }
}
// Phase 3: probs = exp(x - rowmax) / sumexp (padding 0; may alias logits), losses = log(sumexp)
// - tlogit, 0 for an ignored row. The same arithmetic as softmax_xent_forward_rows, so only
// the order of the shard sums separates the two.
void xent_shard_finish_rows(float* losses, float* probs, const float* logits, const float* rowmax,
                            const float* sumexp, const float* tlogit, const int32_t* targets, int64_t r0, int64_t r1,
                            int V, int Vreal) {
  for (int64_t r = r0; r < r1; r++) {
    const float* x = logits + r * V;
    float* p = probs + r * V;
    const float mx = rowmax[r], inv = 1.0f / sumexp[r];
#pragma omp simd
    for (int i = 0; i < Vreal; i++) p[i] = exp_f(x[i] - mx) * inv;
    for (int i = Vreal; i < V; i++) p[i] = 0.0f;
    if (losses) losses[r] = targets[r] >= 0 ? std::log(sumexp[r]) - tlogit[r] : 0.0f;
  }
}

// =============================================================================== optimizer
// adamw_range and sum_squares_range live in adamw.cpp with the fused optimizer kernels
// so that every path runs the same compiled arithmetic.

// =============================================================================== the backend
class CpuBackend final : public Backend {
 public:
  // The kernel table: every kernel below as its F32 entry, the 16-bit-native kernels
  // (ops/cpu/native16.h: this backend's fp32 kernels on widened tiles) as the BF16 and F16
  // entries (the attention's widen while it packs its per-head panels, ops/cpu/attention.cpp),
  // the 16-bit GEMMs where oneDNN has them.
  CpuBackend() {
    provide<k::Convert>(DType::F32, convert_host);
    provide<k::Accumulate>(DType::F32, accumulate_host);
    provide<k::Fill>(DType::F32, fill_host);
    provide_fp32_members(this);
    for (DType t : {DType::BF16, DType::F16})
      provide<k::MatmulForward>(t, [this, t](const k::MatmulForward& q) { matmul_forward_narrow(static_cast<float*>(q.out), q.inp, q.weight, q.bias, t, q.N, q.C, q.OC); }, dnnl_gemm_available);
    for (DType t : {DType::BF16, DType::F16})
      provide<k::MatmulBackward>(t, [this, t](const k::MatmulBackward& q) { matmul_backward_narrow(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), q.dout, q.inp, q.weight, t, q.N, q.C, q.OC); }, dnnl_gemm_available);
    provide<k::KvCacheWrite>(DType::F32, [this](const k::KvCacheWrite& q) { kv_cache_write(q.kv, static_cast<const float*>(q.qkv), q.B, q.T, q.C, q.heads); });
    provide<k::AttentionDecode>(DType::F32, [this](const k::AttentionDecode& q) { attention_decode(static_cast<float*>(q.out), static_cast<const float*>(q.qkv), q.kv, q.pos, q.B, q.C, q.heads, q.theta); });
#define OPS_CPU_ACTIVATION(A, a)                                                                     \
  provide_activation<k::A##Forward, k::A##Backward>([](float x) { return a##_f(x); },                    \
                                                    [](float x) { return a##_grad_f(x); }, native16::a##_forward, \
                                                    native16::a##_backward);
    OPS_ACTIVATIONS(OPS_CPU_ACTIVATION)
#undef OPS_CPU_ACTIVATION
    provide<k::LinearGeluForward>(DType::F32, [this](const k::LinearGeluForward& q) { linear_gelu_forward(static_cast<float*>(q.out), static_cast<float*>(q.pre), static_cast<const float*>(q.inp), static_cast<const float*>(q.weight), static_cast<const float*>(q.bias), q.N, q.C, q.OC); });
    provide_all<k::AddLayerNormForward>([this](const k::AddLayerNormForward& q, DType t) { add_layernorm_forward(q.sum, q.out, static_cast<float*>(q.mean), static_cast<float*>(q.rstd), q.a, q.b, static_cast<const float*>(q.weight), static_cast<const float*>(q.bias), t, q.N, q.C, q.eps); });
    provide_all<k::AddLayerNormBackward>([this](const k::AddLayerNormBackward& q, DType t) { add_layernorm_backward(q.da, q.db, static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), q.dsum, q.dout, q.sum, static_cast<const float*>(q.weight), static_cast<const float*>(q.mean), static_cast<const float*>(q.rstd), t, q.N, q.C); });
    provide_all<k::AddRmsNormForward>([this](const k::AddRmsNormForward& q, DType t) { add_rmsnorm_forward(q.sum, q.out, static_cast<float*>(q.rstd), q.a, q.b, static_cast<const float*>(q.weight), t, q.N, q.C, q.eps); });
    provide_all<k::AddRmsNormBackward>([this](const k::AddRmsNormBackward& q, DType t) { add_rmsnorm_backward(q.da, q.db, static_cast<float*>(q.dweight), q.dsum, q.dout, q.sum, static_cast<const float*>(q.weight), static_cast<const float*>(q.rstd), t, q.N, q.C); });
    provide<k::AdamwUpdateZeroGrad>(DType::F32, [this](const k::AdamwUpdateZeroGrad& q) { adamw_update_zero_grad(q.param, q.pt, q.grad, q.gt, static_cast<float*>(q.master), static_cast<float*>(q.m), static_cast<float*>(q.v), q.n, q.a); });
    provide16<k::EmbeddingForward>([this](const k::EmbeddingForward& q, DType t) { native16::embedding_forward(*this, q.out, t, q.tokens, q.wte, q.wpe, q.B, q.T, q.C); });
    provide16<k::EmbeddingBackward>([this](const k::EmbeddingBackward& q, DType t) { native16::embedding_backward(*this, q.dwte, q.dwpe, q.dout, t, q.tokens, q.B, q.T, q.C); });
    provide16<k::LayerNormForward>([this](const k::LayerNormForward& q, DType t) { native16::layernorm_forward(*this, q.out, q.mean, q.rstd, q.inp, q.weight, q.bias, t, q.N, q.C, q.eps); });
    provide16<k::LayerNormBackward>([this](const k::LayerNormBackward& q, DType t) { native16::layernorm_backward(*this, q.dinp, q.dweight, q.dbias, q.dout, q.inp, q.weight, q.mean, q.rstd, t, q.N, q.C); });
    provide16<k::RmsNormForward>([this](const k::RmsNormForward& q, DType t) { native16::rmsnorm_forward(*this, q.out, q.rstd, q.inp, q.weight, t, q.N, q.C, q.eps); });
    provide16<k::RmsNormBackward>([this](const k::RmsNormBackward& q, DType t) { native16::rmsnorm_backward(*this, q.dinp, q.dweight, q.dout, q.inp, q.weight, q.rstd, t, q.N, q.C); });
    provide16<k::RopeForward>([this](const k::RopeForward& q, DType t) { native16::rope_forward(*this, q.out, q.inp, t, q.B, q.T, q.C, q.heads, q.theta); });
    provide16<k::RopeBackward>([this](const k::RopeBackward& q, DType t) { native16::rope_backward(*this, q.dinp, q.dout, t, q.B, q.T, q.C, q.heads, q.theta); });
    provide16<k::SwigluForward>([this](const k::SwigluForward& q, DType t) { native16::swiglu_forward(*this, q.out, q.inp, t, q.N, q.H); });
    provide16<k::SwigluBackward>([this](const k::SwigluBackward& q, DType t) { native16::swiglu_backward(*this, q.dinp, q.dout, q.inp, t, q.N, q.H); });
    provide16<k::AddForward>([this](const k::AddForward& q, DType t) { native16::add_forward(*this, q.out, q.a, q.b, t, q.n); });
    provide16<k::AddInplace>([this](const k::AddInplace& q, DType t) { native16::add_inplace(*this, q.dst, q.src, t, q.n); });
    provide16<k::DropoutForward>([this](const k::DropoutForward& q, DType t) { native16::dropout_forward(*this, q.out, q.inp, t, q.n, q.drop); });
    provide16<k::DropoutBackward>([this](const k::DropoutBackward& q, DType t) { native16::dropout_backward(*this, q.dinp, q.dout, t, q.n, q.drop); });
    provide16<k::AttentionForward>([this](const k::AttentionForward& q, DType t) { cpu::attention_forward16(q.out, q.lse, q.qkv, t, q.B, q.T, q.C, q.heads, q.drop); });
    provide16<k::AttentionBackward>([this](const k::AttentionBackward& q, DType t) { cpu::attention_backward16(q.dqkv, q.dout, q.qkv, q.lse, t, q.B, q.T, q.C, q.heads, q.drop, q.work); });
  }
  const char* name() const override { return "cpu"; }

  // (The unsharded embedding is the shard that holds the whole table: embedding_*_as_shard.)
  void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                               int C, int vstart, int Vlocal) {
    const int64_t N = static_cast<int64_t>(B) * T;
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      embedding_forward_rows(out, tokens, wte, wpe, r0, r1, T, C, vstart, Vlocal);
    }, 1);
  }
  void embedding_shard_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                int C, int vstart, int Vlocal) {
    if (!dwte && !dwpe) return;
    const int64_t N = static_cast<int64_t>(B) * T;
    parallel_chunks(C, std::max<int64_t>(16, kGrainStream / std::max<int64_t>(N, 1)), [=](int64_t c0, int64_t c1) {
      embedding_backward_cols(dwte, dwpe, dout, tokens, N, T, C, vstart, Vlocal, c0, c1);
    });
  }

  // Null weight / bias mean ones / zeros (a LayerNorm without affine parameters).
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, float eps) {
    std::vector<float> ones, zeros;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    if (!bias) bias = (zeros.assign(C, 0.0f), zeros.data());
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      layernorm_forward_rows(out, mean, rstd, inp, weight, bias, r0, r1, C, eps);
    }, 1);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) {
    if (!dinp && !dweight && !dbias) return;
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    const int64_t block = reduce_block_rows(C);
    Partials part(static_cast<int>(num_blocks(N, block)), 2 * static_cast<int64_t>(C));  // [dweight | dbias] per block
    Partials* pp = &part;
    parallel_blocks(N, block, [=](int64_t r0, int64_t r1, int blk) {
      float* pw = pp->slot(blk);
      layernorm_backward_rows(dinp, dweight ? pw : nullptr, dbias ? pw + C : nullptr, dout, inp, weight, mean, rstd,
                              r0, r1, C);
    });
    part.fold(dweight, 0, C);
    part.fold(dbias, C, C);
  }

  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) {
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      rmsnorm_forward_rows(out, rstd, inp, weight, r0, r1, C, eps);
    }, 1);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) {
    if (!dinp && !dweight) return;
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    const int64_t block = reduce_block_rows(C);
    Partials part(static_cast<int>(num_blocks(N, block)), C);
    Partials* pp = &part;
    parallel_blocks(N, block, [=](int64_t r0, int64_t r1, int blk) {
      rmsnorm_backward_rows(dinp, dweight ? pp->slot(blk) : nullptr, dout, inp, weight, rstd, r0, r1, C);
    });
    part.fold(dweight, 0, C);
  }

  // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC) {
    float beta = 0.0f;
    if (bias) {
      // Prefill with the bias and let the GEMM accumulate (beta = 1): the same memory
      // traffic as OpenBLAS zeroing C for beta = 0, and no extra pass afterwards.
      parallel_chunks(N, row_grain(OC, kGrainStream), [=](int64_t r0, int64_t r1) {
        bias_fill_rows(out, bias, r0, r1, OC);
      }, 1);
      beta = 1.0f;
    }
    sgemm_fixed_k(false, true, N, OC, C, inp, C, weight, C, beta, out, OC);
  }
  // dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp; dbias (OC) += colsum(dout)
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC) {
    if (dinp)
      sgemm_fixed_k(false, false, N, C, OC, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight)
      sgemm_fixed_k(true, false, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias)
      parallel_chunks(OC, std::max<int64_t>(16, kGrainStream / std::max(N, 1)), [=](int64_t c0, int64_t c1) {
        bias_backward_cols(dbias, dout, N, OC, c0, c1);
      });
  }

  // The same three GEMMs over 16-bit operands, through oneDNN (dnnl_gemm.h), each split by
  // the shape alone (dnnl_rows_fixed, dnnl_dweight_fixed). The bias is widened into a small
  // host vector (OC floats); everything else is read as stored.
  void matmul_forward_narrow(float* out, const void* inp, const void* weight, const void* bias, DType t, int N, int C,
                        int OC) {
    std::vector<float> b32;
    if (bias) {
      b32.resize(static_cast<size_t>(OC));
      to_f32(b32.data(), bias, t, OC);
    }
    // out (N,OC) = inp (N,C) @ weight^T, weight stored (OC,C)
    dnnl_rows_fixed(t, true, N, OC, C, inp, C, weight, C, bias ? b32.data() : nullptr, false, out, OC);
  }
  void matmul_backward_narrow(float* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                         const void* weight, DType t, int N, int C, int OC) {
    // dinp (N,C) += dout (N,OC) @ weight (OC,C)
    if (dinp) dnnl_rows_fixed(t, false, N, C, OC, dout, OC, weight, C, nullptr, true, dinp, C);
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C), dout stored (N,OC)
    if (dweight) dnnl_dweight_fixed(dweight, dout, inp, t, N, C, OC);
    if (dbias) {
      const auto* d16 = static_cast<const uint16_t*>(dout);
      parallel_chunks(OC, std::max<int64_t>(16, kGrainStream / std::max(N, 1)), [=](int64_t c0, int64_t c1) {
        bias_backward_cols16(dbias, d16, t, N, OC, c0, c1);
      });
    }
  }

  void rope_forward(float* out, const float* inp, int B, int T, int C, Heads heads, float theta) {
    rope_dispatch(out, inp, B, T, C, heads, theta, /*inverse=*/false);
  }
  void rope_backward(float* dinp, const float* dout, int B, int T, int C, Heads heads, float theta) {
    if (!dinp) return;
    rope_dispatch(dinp, dout, B, T, C, heads, theta, /*inverse=*/true);
  }

  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads heads,
                         DropoutSpec drop) {
    cpu::attention_forward(out, lse, qkv, B, T, C, heads, drop);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                          Heads heads, DropoutSpec drop, float* work) {
    cpu::attention_backward(dqkv, dout, qkv, lse, B, T, C, heads, drop, work);
  }

  void kv_cache_write(KvView kv, const float* qkv, int B, int T, int C, Heads heads) {
    cpu::kv_cache_write(kv, qkv, B, T, C, heads);
  }
  // Rope at each row's own position, from the table rope_forward uses (same angles, same
  // products), on a copy of q and k; then the cached attention.
  void attention_decode(float* out, const float* qkv, KvView kv, const int32_t* pos, int B, int C, Heads heads,
                        float theta) {
    if (theta <= 0.0f) return cpu::attention_decode(out, qkv, kv, pos, B, C, heads);
    const int NH = heads.q;
    OPS_CHECK(NH > 0 && C % NH == 0 && (C / NH) % 2 == 0, "attention_decode: rope needs an even head size");
    int maxp = 0;
    for (int b = 0; b < B; b++) maxp = std::max(maxp, pos[b]);
    const int HS = C / NH, half = HS / 2, W = C + 2 * heads.kv * HS;
    const std::shared_ptr<const RopeTable> tab = rope_table(maxp + 1, HS, theta);
    std::vector<float>& r = decode_roped_;
    r.assign(qkv, qkv + static_cast<size_t>(B) * W);
    for (int b = 0; b < B; b++) {
      const float* cs = tab->cos.data() + static_cast<size_t>(pos[b]) * half;
      const float* sn = tab->sin.data() + static_cast<size_t>(pos[b]) * half;
      float* y = r.data() + static_cast<size_t>(b) * W;
      for (int hh = 0; hh < NH + heads.kv; hh++) {  // q heads, then k heads
        float* y1 = y + hh * HS;
        float* y2 = y1 + half;
        for (int i = 0; i < half; i++) {
          const float a = y1[i], c = y2[i];
          y1[i] = a * cs[i] - c * sn[i];
          y2[i] = c * cs[i] + a * sn[i];
        }
      }
    }
    cpu::attention_decode(out, r.data(), kv, pos, B, C, heads);
  }

  template <class F> void activation_forward(float* out, const float* inp, int64_t n, F f) {
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) { activation_forward_range(out + i0, inp + i0, i1 - i0, f); });
  }
  template <class DF> void activation_backward(float* dinp, const float* inp, const float* dout, int64_t n, DF df) {
    if (!dinp) return;
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
      activation_backward_range(dinp + i0, inp + i0, dout + i0, i1 - i0, df);
    });
  }
  template <class Fwd, class Bwd, class F, class DF>
  void provide_activation(F f, DF df, Native16Forward fwd16, Native16Backward bwd16) {
    provide<Fwd>(DType::F32, [this, f](const Fwd& q) {
      activation_forward(static_cast<float*>(q.out), static_cast<const float*>(q.inp), q.n, f);
    });
    provide<Bwd>(DType::F32, [this, df](const Bwd& q) {
      activation_backward(static_cast<float*>(q.dinp), static_cast<const float*>(q.inp), static_cast<const float*>(q.dout), q.n, df);
    });
    provide16<Fwd>([this, fwd16](const Fwd& q, DType t) { fwd16(*this, q.out, q.inp, t, q.n); });
    provide16<Bwd>([this, bwd16](const Bwd& q, DType t) { bwd16(*this, q.dinp, q.inp, q.dout, t, q.n); });
  }

  // LinearGelu (fused.h). Forward: this backend's matmul_forward (the bias
  // prefilled, then the GEMM accumulating into it) and its GELU pass, unchanged, so pre and out
  // are the unfused pair's bits. Backward: one pass writes d(pre) over d(out) and sums the bias
  // gradient (the unfused path's GELU pass, zeroed buffer and bias pass), then the two GEMMs.
  void linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int N,
                           int C, int OC) {
    matmul_forward(pre, inp, weight, bias, N, C, OC);
    activation_forward(out, pre, static_cast<int64_t>(N) * OC, [](float x) { return gelu_f(x); });
  }
  void linear_gelu_backward(float* dinp, float* dweight, float* dbias, float* dpre, const float* pre,
                            const float* inp, const float* weight, int N, int C, int OC) {
    gelu_backward_bias(dpre, dbias, pre, N, OC);
    matmul_backward(dinp, dweight, nullptr, dpre, inp, weight, N, C, OC);
  }

  // AddNorm (ops/kernels.h). Forward: per chunk of rows the Add's pass, then the
  // norm's rows over the sum just written (still in cache). Backward: per fixed reduction block
  // (reduce_block_rows, never the thread count) the norm's rows accumulating into dsum, then
  // dsum added into da and db while the block is in cache, and the weight partials folded in
  // block order. The unfused kernels' row functions, blocks and order: their bits. 16-bit:
  // native16.cpp, the same over widened tiles.
  void add_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* a, const void* b,
                             const float* weight, const float* bias, DType t, int N, int C, float eps) {
    if (t != DType::F32)
      return native16::add_layernorm_forward(*this, sum, out, mean, rstd, a, b, weight, bias, t, N, C, eps);
    std::vector<float> ones, zeros;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    if (!bias) bias = (zeros.assign(C, 0.0f), zeros.data());
    float* o = static_cast<float*>(out);
    add_norm_forward_chunks(sum, a, b, N, C, [=](const float* s, int64_t r0, int64_t r1) {
      layernorm_forward_rows(o, mean, rstd, s, weight, bias, r0, r1, C, eps);
    });
  }
  void add_layernorm_backward(void* da, void* db, float* dweight, float* dbias, void* dsum, const void* dout,
                              const void* sum, const float* weight, const float* mean, const float* rstd, DType t,
                              int N, int C) {
    if (t != DType::F32)
      return native16::add_layernorm_backward(*this, da, db, dweight, dbias, dsum, dout, sum, weight, mean, rstd, t,
                                              N, C);
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    const float* dy = static_cast<const float*>(dout);
    const float* x = static_cast<const float*>(sum);
    Partials part = add_norm_backward_blocks(da, db, dsum, N, C, 2, [=](float* ds, float* pw, int64_t r0, int64_t r1) {
      layernorm_backward_rows(ds, dweight ? pw : nullptr, dbias ? pw + C : nullptr, dy, x, weight, mean, rstd, r0,
                              r1, C);
    });
    part.fold(dweight, 0, C);
    part.fold(dbias, C, C);
  }
  void add_rmsnorm_forward(void* sum, void* out, float* rstd, const void* a, const void* b, const float* weight,
                           DType t, int N, int C, float eps) {
    if (t != DType::F32) return native16::add_rmsnorm_forward(*this, sum, out, rstd, a, b, weight, t, N, C, eps);
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    float* o = static_cast<float*>(out);
    add_norm_forward_chunks(sum, a, b, N, C, [=](const float* s, int64_t r0, int64_t r1) {
      rmsnorm_forward_rows(o, rstd, s, weight, r0, r1, C, eps);
    });
  }
  void add_rmsnorm_backward(void* da, void* db, float* dweight, void* dsum, const void* dout, const void* sum,
                            const float* weight, const float* rstd, DType t, int N, int C) {
    if (t != DType::F32)
      return native16::add_rmsnorm_backward(*this, da, db, dweight, dsum, dout, sum, weight, rstd, t, N, C);
    std::vector<float> ones;
    if (!weight) weight = (ones.assign(C, 1.0f), ones.data());
    const float* dy = static_cast<const float*>(dout);
    const float* x = static_cast<const float*>(sum);
    Partials part = add_norm_backward_blocks(da, db, dsum, N, C, 1, [=](float* ds, float* pw, int64_t r0, int64_t r1) {
      rmsnorm_backward_rows(ds, dweight ? pw : nullptr, dy, x, weight, rstd, r0, r1, C);
    });
    part.fold(dweight, 0, C);
  }

  void swiglu_forward(float* out, const float* inp, int N, int H) {
    parallel_chunks(N, row_grain(H, kGrainMath), [=](int64_t r0, int64_t r1) {
      swiglu_forward_rows(out, inp, r0, r1, H);
    }, 1);
  }
  void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) {
    if (!dinp) return;
    parallel_chunks(N, row_grain(H, kGrainMath), [=](int64_t r0, int64_t r1) {
      swiglu_backward_rows(dinp, dout, inp, r0, r1, H);
    }, 1);
  }

  void add_forward(float* out, const float* a, const float* b, int64_t n) {
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) { add_range(out + i0, a + i0, b + i0, i1 - i0); });
  }
  void add_inplace(float* dst, const float* src, int64_t n) {
    if (!dst) return;
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) { add_inplace_range(dst + i0, src + i0, i1 - i0); });
  }

  void dropout_forward(float* out, const float* inp, int64_t n, DropoutSpec drop) {
    check_dropout(drop);
    if (drop.p <= 0.0f) {
      if (out != inp)
        parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) {
          std::memcpy(out + i0, inp + i0, sizeof(float) * (i1 - i0));
        });
      return;
    }
    const float scale = 1.0f / (1.0f - drop.p);
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
      dropout_forward_range(out, inp, i0, i1, drop.key, drop.offset, drop.p, scale);
    });
  }
  void dropout_backward(float* dinp, const float* dout, int64_t n, DropoutSpec drop) {
    if (!dinp) return;
    check_dropout(drop);
    if (drop.p <= 0.0f) return add_inplace(dinp, dout, n);
    const float scale = 1.0f / (1.0f - drop.p);
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
      dropout_backward_range(dinp, dout, i0, i1, drop.key, drop.offset, drop.p, scale);
    });
  }

  // Parallel over rows (one row of GPT-2's vocabulary is 50257 exps).
  void softmax_xent_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V,
                            int Vreal) {
    OPS_CHECK(Vreal > 0 && Vreal <= V, "softmax_xent: need 0 < Vreal <= V, got Vreal=" + std::to_string(Vreal) +
                                              " V=" + std::to_string(V));
    parallel_chunks(N, row_grain(V, kGrainMath), [=](int64_t r0, int64_t r1) {
      softmax_xent_forward_rows(losses, probs, logits, targets, r0, r1, V, Vreal);
    }, 1);
  }
  void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V,
                             int Vreal) {
    if (!dlogits) return;
    parallel_chunks(N, row_grain(V, kGrainStream), [=](int64_t r0, int64_t r1) {
      softmax_xent_backward_rows(dlogits, probs, targets, dloss, r0, r1, V, Vreal, 0);
    }, 1);
  }

  // Vocabulary-parallel cross-entropy: the phases of softmax_xent_forward on a column shard.
  void xent_shard_max(float* rowmax, const float* logits, int N, int V, int Vreal) {
    check_shard(V, Vreal);
    parallel_chunks(N, row_grain(V, kGrainStream), [=](int64_t r0, int64_t r1) {
      xent_shard_max_rows(rowmax, logits, r0, r1, V, Vreal);
    }, 1);
  }
  void xent_shard_sumexp(float* sumexp, float* tlogit, const float* logits, const float* rowmax,
                         const int32_t* targets, int N, int V, int Vreal, int vstart) {
    check_shard(V, Vreal);
    parallel_chunks(N, row_grain(V, kGrainMath), [=](int64_t r0, int64_t r1) {
      xent_shard_sumexp_rows(sumexp, tlogit, logits, rowmax, targets, r0, r1, V, Vreal, vstart);
    }, 1);
  }
  void xent_shard_finish(float* losses, float* probs, const float* logits, const float* rowmax, const float* sumexp,
                         const float* tlogit, const int32_t* targets, int N, int V, int Vreal) {
    check_shard(V, Vreal);
    parallel_chunks(N, row_grain(V, kGrainMath), [=](int64_t r0, int64_t r1) {
      xent_shard_finish_rows(losses, probs, logits, rowmax, sumexp, tlogit, targets, r0, r1, V, Vreal);
    }, 1);
  }
  void xent_shard_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V,
                           int Vreal, int vstart) {
    if (!dlogits) return;
    check_shard(V, Vreal);
    parallel_chunks(N, row_grain(V, kGrainStream), [=](int64_t r0, int64_t r1) {
      softmax_xent_backward_rows(dlogits, probs, targets, dloss, r0, r1, V, Vreal, vstart);
    }, 1);
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t t, float grad_scale) {
    OPS_CHECK(t >= 1, "adamw_update: step t must be >= 1, got " + std::to_string(t));
    // Bias corrections in double: beta2^t for t ~ 1e5 underflows nothing but loses digits in fp32.
    const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t))));
    const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t))));
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
      adamw_range(param + i0, grad + i0, m + i0, v + i0, i1 - i0, lr, beta1, beta2, eps, weight_decay, inv_bc1,
                  inv_bc2, grad_scale);
    });
  }

  // The optimizer phase in one threaded pass over fixed blocks (adamw.h):
  // the same bits as the compositions (adamw_update_typed_composed, then mem_zero of the
  // gradient), on any thread count.
  void adamw_update_typed(void* param, DType pt, const void* grad, DType gt, float* master, float* m, float* v,
                          int64_t n, const AdamwArgs& a) {
    // zero_grad false: the gradient is only read.
    adamw_update_fused(param, pt, const_cast<void*>(grad), gt, master, m, v, n, a, false);
  }
  void adamw_update_zero_grad(void* param, DType pt, void* grad, DType gt, float* master, float* m, float* v,
                              int64_t n, const AdamwArgs& a) {
    adamw_update_fused(param, pt, grad, gt, master, m, v, n, a, true);
  }
  // 16-bit gradients (the norm's sum of squares) widened and summed over the team in fixed
  // blocks: the host default's bits, which widened them on one thread.
  double sum_squares_typed(const void* x, DType t, int64_t n) {
    if (t == DType::BF16 || t == DType::F16) return sum_squares16(x, t, n);
    double r = 0;
    sum_squares_typed_composed(*this, k::SumSquaresTyped{x, t, n, &r});
    return r;
  }
  void mem_zero(void* p, size_t bytes) override { cpu::mem_zero(p, bytes); }

  // Per-block partials (fixed blocks of kGrainStream elements) summed in block order: the
  // same bits on any thread count.
  double sum_squares(const float* x, int64_t n) {
    std::vector<double> part(static_cast<size_t>(num_blocks(n, kGrainStream)), 0.0);
    double* pp = part.data();
    parallel_blocks(n, kGrainStream, [=](int64_t i0, int64_t i1, int blk) {
      pp[blk] = sum_squares_range(x + i0, i1 - i0);
    });
    double total = 0.0;
    for (double s : part) total += s;
    return total;
  }

  void scale(float* x, int64_t n, float s) {
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) { scale_range(x + i0, i1 - i0, s); });
  }

 private:
  static void check_shard(int V, int Vreal) {
    OPS_CHECK(V > 0 && Vreal >= 0 && Vreal <= V, "xent_shard: need 0 <= Vreal <= V, got Vreal=" +
                                                        std::to_string(Vreal) + " V=" + std::to_string(V));
  }
  static void check_dropout(const DropoutSpec& drop) {
    OPS_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "dropout: p must be in [0, 1), got " + std::to_string(drop.p));
  }

  // cos/sin of t * theta^(-2i/HS) for t < T, i < HS/2, computed in double (an fp32 angle
  // t * f would be off by ~t * 6e-8 rad) and cached: the table depends only on (T, HS, theta).
  struct RopeTable {
    int T = 0, HS = 0;
    float theta = 0.0f;
    std::vector<float> cos, sin;  // (T, HS/2)
  };
  std::vector<float> decode_roped_;  // attention_decode's rotated copy of q and k (outside the ledger)
  std::mutex rope_mutex_;
  std::shared_ptr<const RopeTable> rope_table_;

  // The current table, rebuilt when a longer T or another (HS, theta) is asked for. The
  // shared_ptr keeps a table alive for a caller while another thread replaces it.
  std::shared_ptr<const RopeTable> rope_table(int T, int HS, float theta) {
    std::lock_guard<std::mutex> lock(rope_mutex_);
    if (rope_table_ && rope_table_->T >= T && rope_table_->HS == HS && rope_table_->theta == theta)
      return rope_table_;
    const int half = HS / 2;
    auto tab = std::make_shared<RopeTable>();
    tab->T = T;
    tab->HS = HS;
    tab->theta = theta;
    tab->cos.resize(static_cast<size_t>(T) * half);
    tab->sin.resize(static_cast<size_t>(T) * half);
    for (int i = 0; i < half; i++) {
      const double f = std::pow(static_cast<double>(theta), -2.0 * i / HS);
      for (int t = 0; t < T; t++) {
        tab->cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(t * f));
        tab->sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(t * f));
      }
    }
    rope_table_ = tab;
    return tab;
  }

  void rope_dispatch(float* dst, const float* src, int B, int T, int C, Heads heads, float theta, bool inverse) {
    const int NH = heads.q;
    OPS_CHECK(NH > 0 && heads.kv > 0 && C % NH == 0 && (C / NH) % 2 == 0,
                 "rope: head size C/NH must be even, got C=" + std::to_string(C) + " NH=" + std::to_string(NH));
    const int HS = C / NH, NKV = heads.kv;
    const std::shared_ptr<const RopeTable> tab = rope_table(T, HS, theta);
    const float* cos_tab = tab->cos.data();
    const float* sin_tab = tab->sin.data();
    parallel_chunks(static_cast<int64_t>(B) * T, row_grain(C + 2 * NKV * HS, kGrainStream), [=](int64_t r0, int64_t r1) {
      rope_rows(dst, src, cos_tab, sin_tab, r0, r1, T, HS, NH, NKV, inverse);
    }, 1);
  }
};

// Debian 12's OpenBLAS 0.3.21 is a DYNAMIC_ARCH build that picks its kernels from the CPU
// model number at load time. CPUs released after it (e.g. Emerald Rapids, family 6 model
// 0xCF, this project's CI machine) are unknown to it and get the generic "Prescott" SSE3
// kernels: ~5x slower SGEMM than its AVX-512 ones (bench/bench_kernels). When the user has
// not chosen a core with OPENBLAS_CORETYPE, pick the best one the instruction set supports
// and re-run OpenBLAS's core selection (the same path OPENBLAS_CORETYPE takes at load).
// The symbols are weak so that a non-DYNAMIC_ARCH OpenBLAS still links (and is left alone).
extern "C" {
__attribute__((weak)) void gotoblas_dynamic_init(void);
__attribute__((weak)) void gotoblas_dynamic_quit(void);
}

void select_openblas_core() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
  const char* core = openblas_get_corename();
  auto is_one_of = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (core && strcasecmp(core, n) == 0) return true;
    return false;
  };
  const char* want = nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    if (!is_one_of({"SkylakeX", "Cooperlake", "SapphireRapids"}))
      want = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (!is_one_of({"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})) want = "Haswell";
  }
  if (!want) return;
  setenv("OPENBLAS_CORETYPE", want, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
#endif
}

}  // namespace

int64_t norm_reduce_block_rows(int64_t C) { return reduce_block_rows(C); }

}  // namespace cpu

Backend& cpu_backend() {
  static cpu::CpuBackend backend = [] {
    cpu::select_openblas_core();
    return cpu::CpuBackend();
  }();
  return backend;
}

void set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace ops
