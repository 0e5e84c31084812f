// Causal multi-head self-attention on the CPU: forward and backward side by side, with
// grouped-query attention (ops/backend.h, Heads): query head h reads key-value head
// heads.kv_of(h); qkv rows are [q: NH*HS | k: NKV*HS | v: NKV*HS].
//
// Forward (per head, scale = 1/sqrt(HS), Vaswani et al. 2017 eq. 1):
//   S = scale Q K^T;  P = softmax_rows(S) (causal);  Pd = P * M / (1-p);  O = Pd V;
//   lse = rowmax(S) + log(rowsum(exp(S - rowmax)))  (saved: one float per query row)
// Backward (S and P recomputed by blocks; M is the dropout keep mask, regenerated from the counter RNG with the forward's
// counters offset + ((b*NH + h)*T + t)*T + s; under tensor parallelism the head index is the
// global one, b*heads_total + head_start + h, so a head shard draws the unsharded model's mask):
//   dV += Pd^T dO;  dPd = dO V^T;  dP = dPd * M / (1-p);
//   dS = P * (dP - rowsum(dP * P))   (softmax Jacobian);
//   dQ += scale dS K;  dK += scale dS^T Q.
//
// Design:
// - The (T, T) probabilities are never stored (flash-style, so that memory stays linear in T: Dao et al. 2022,
//   "FlashAttention"). Both passes work on one block of query rows at a time, in per-thread
//   scratch of (block rows) x T floats: the forward computes the block's scores, softmax and
//   output, saves each row's log-sum-exp and drops the block; the backward recomputes the
//   block's scores with the same product and its softmax with the same instructions, so its
//   probabilities are bit-identical to the forward's (and to those this kernel used to store).
//   A block takes all of its keys at once (keys are not split into blocks with an online
//   softmax rescaling the output, as on a GPU whose shared memory holds a few key tiles): at
//   64 rows, the block's scores are 64 x T floats (256 KiB at T = 1024), which the caches of
//   a CPU hold, and the row's statistics then come out exactly as the unblocked softmax's.
// - Causality is exploited by blocking the query rows: rows [r0, r1) attend to keys
//   [0, r1) only, so a block's scores are (r1-r0) x r1, not (r1-r0) x T; only the diagonal
//   block computes (and then discards) masked entries.
// - The products run in small_gemm.h's register-tiled kernel rather than cblas_sgemm: at
//   these sizes (K = HS = 64) OpenBLAS spends as long packing operands as multiplying.
//   Q, K, V and dO are packed once per unit of work into fp32 panels whose rows are padded to
//   16 floats (K and V also transposed); P^T and dS^T are read in place by swapping strides, so
//   no transposes of them are materialized. small_gemm's sums do not depend on its operands'
//   strides, so packing Q and dO (read in place through strides before the 16-bit-native kernels) changed no bit.
// - The storage type of qkv, out, dout and dqkv is a template parameter (fp32,
//   bf16, fp16): a 16-bit qkv and dout are widened (exactly) while their panels are packed, so
//   no whole-tensor fp32 copy exists; out is rounded row by row from the block's fp32 Ob tile;
//   dqkv gets one fold per element, RNE(d + (0 + g)), g the fp32 gradient the widened path
//   accumulates into a zeroed copy (for a grouped key-value head, its group's panels summed from
//   zero in head order), which is what Backend::accumulate then folds. Everything between the
//   packing and the store is the fp32 kernel's code, so both paths agree bit for bit.
// - Row-wise softmax and dropout run over rows padded to a multiple of 16 with the masked
//   lanes selected away, so every loop is whole vectors without scalar tails.
// - One (b, h) is one unit of work (its operands are packed once); the OpenMP team takes
//   units dynamically. Per-thread scratch is grown once and reused.
// - Grouped-query backward: the query heads of a group add into the same dK and dV. To stay
//   deterministic whatever the thread count (bitwise resume), each (b, h) unit writes its dK,
//   dV panel to the caller's workspace, and a second pass sums a group's panels in head order.
//   Full multi-head attention (group 1) adds straight into dqkv, as before.
#include "ops/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ops/convert.h"
#include "ops/cpu/small_gemm.h"
#include "ops/cpu/tile_convert.h"
#include "ops/cpu/vecmath.h"
#include "ops/rng.h"
#include "ops/check.h"

namespace ops::cpu {

namespace {

int g_block_rows = 64;

inline int round16(int n) { return (n + 15) & ~15; }

// Per-thread scratch, grown on demand and kept for the life of the (persistent) OpenMP
// worker thread, so steady-state training allocates nothing here.
struct Scratch {
  std::vector<float> buf[12];
};
thread_local Scratch t_scratch;
float* grow(int slot, size_t n) {
  std::vector<float>& v = t_scratch.buf[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The element types qkv, out, dout and dqkv are stored in: fp32, or a 16-bit format that the
// packing widens (exactly) and the output's store rounds (to nearest even, ops/convert.h).
struct InF32 {
  using E = float;
  static constexpr DType t = DType::F32;
  static float w(float x) { return x; }
};
struct InBF16 {
  using E = uint16_t;
  static constexpr DType t = DType::BF16;
  static float w(uint16_t x) { return bf16_to_f32(x); }
};
struct InF16 {
  using E = uint16_t;
  static constexpr DType t = DType::F16;
  static float w(uint16_t x) { return f16_to_f32(x); }
};

// Packs rows [0, n) of a (n, HS) strided view into a row-major fp32 (n, HSp) panel, padding with 0.
template <class In>
void pack_rows(float* dst, const typename In::E* src, int64_t ld, int n, int HS, int HSp) {
  for (int t = 0; t < n; t++) {
    float* d = dst + static_cast<size_t>(t) * HSp;
    if constexpr (In::t == DType::F32) std::memcpy(d, src + t * ld, sizeof(float) * HS);
    else tile_to_f32(d, src + t * ld, In::t, HS);
    for (int i = HS; i < HSp; i++) d[i] = 0.0f;
  }
}
// Packs rows [0, n) of a (n, HS) strided fp32 view transposed into a row-major (HS, np) panel,
// columns [n, np) zero. In 16-row tiles, so that the 16 source rows stay in L1 while each
// destination row gets one contiguous 64-byte write.
void pack_transposed_f32(float* dst, const float* src, int64_t ld, int n, int HS, int np) {
  for (int i = 0; i < HS; i++) std::fill(dst + static_cast<size_t>(i) * np + n, dst + static_cast<size_t>(i + 1) * np, 0.0f);
  int t0 = 0;
  for (; t0 + 16 <= n; t0 += 16) {
    const float* s = src + t0 * ld;
    for (int i = 0; i < HS; i++) {
      float* d = dst + static_cast<size_t>(i) * np + t0;
#pragma omp simd
      for (int tt = 0; tt < 16; tt++) d[tt] = s[tt * ld + i];  // a 16-lane gather
    }
  }
  if (t0 < n) {
    const float* s = src + t0 * ld;
    for (int i = 0; i < HS; i++)
      for (int tt = 0; tt < n - t0; tt++) dst[static_cast<size_t>(i) * np + t0 + tt] = s[tt * ld + i];
  }
}
// The same from In's storage: a 16-bit view is widened 16 rows at a time into a small fp32
// tile (contiguous rows, vector conversions), whose columns are then gathered as above.
template <class In>
void pack_transposed(float* dst, const typename In::E* src, int64_t ld, int n, int HS, int np) {
  if constexpr (In::t == DType::F32) {
    pack_transposed_f32(dst, src, ld, n, HS, np);
  } else {
    thread_local std::vector<float> tile;
    if (tile.size() < static_cast<size_t>(16) * HS) tile.resize(static_cast<size_t>(16) * HS);
    float* w = tile.data();
    for (int i = 0; i < HS; i++) std::fill(dst + static_cast<size_t>(i) * np + n, dst + static_cast<size_t>(i + 1) * np, 0.0f);
    for (int t0 = 0; t0 < n; t0 += 16) {
      const int m = std::min(16, n - t0);
      for (int tt = 0; tt < m; tt++) tile_to_f32(w + static_cast<size_t>(tt) * HS, src + (t0 + tt) * ld, In::t, HS);
      for (int i = 0; i < HS; i++) {
        float* d = dst + static_cast<size_t>(i) * np + t0;
        if (m == 16) {
#pragma omp simd
          for (int tt = 0; tt < 16; tt++) d[tt] = w[tt * HS + i];
        } else {
          for (int tt = 0; tt < m; tt++) d[tt] = w[tt * HS + i];
        }
      }
    }
  }
}

// One output row of HS values from the fp32 block tile: copied, or rounded to In's format.
template <class In>
void store_row(typename In::E* dst, const float* src, int HS) {
  if constexpr (In::t == DType::F32) std::memcpy(dst, src, sizeof(float) * HS);
  else tile_from_f32(dst, src, In::t, HS);
}


// keep[s] = 1/(1-p) if rng_uniform(key, counter0 + s) >= p else 0, s in [0, n) (n a multiple of 16).
OPS_INLINE void dropout_factors(float* keep, int n, uint64_t key, uint64_t counter0, float p, float kscale) {
#pragma omp simd
  for (int s = 0; s < n; s++) keep[s] = rng_uniform(key, counter0 + static_cast<uint64_t>(s)) >= p ? kscale : 0.0f;
}

// One row of the causal softmax. In: scores row[0, n16) (valid for s < n, n16 = round16(n)).
// Out: row[s] = exp(score - max) for s < n, 0 for n <= s < n16; returns 1 / sum, and the
// row's log-sum-exp, max + log(sum), in *lse when given.
OPS_INLINE float softmax_row_exp(float* row, int n, int n16, float* lse = nullptr) {
  const vf16 ninf = splat16(-std::numeric_limits<float>::infinity());
  vf16 vmx = ninf;
  for (int s0 = 0; s0 < n16; s0 += 16) {
    const vf16 x = load16(row + s0);
    const vf16 xm = iota16() + s0 < n ? x : ninf;
    vmx = xm > vmx ? xm : vmx;
  }
  const float mx = hmax16(vmx);
  vf16 vsum{};
  for (int s0 = 0; s0 < n16; s0 += 16) {
    const vf16 e = iota16() + s0 < n ? exp16(load16(row + s0) - mx) : vf16{};
    store16(row + s0, e);
    vsum += e;
  }
  const float sum = hsum16(vsum);
  if (lse) *lse = mx + std::log(sum);
  return 1.0f / sum;
}

// dS = P * (dP - rowsum(dP * P)) on one row of nv entries (a multiple of 16 or the row end T),
// keeping only s < n.
OPS_INLINE void softmax_row_backward(float* ds, const float* p, int n, int nv) {
  int s0 = 0;
  vf16 vdot{};
  for (; s0 + 16 <= nv; s0 += 16) vdot += load16(ds + s0) * load16(p + s0);
  float dot = hsum16(vdot);
  for (int s = s0; s < nv; s++) dot += ds[s] * p[s];
  for (s0 = 0; s0 + 16 <= nv; s0 += 16) {
    const vf16 r = load16(p + s0) * (load16(ds + s0) - dot);
    store16(ds + s0, iota16() + s0 < n ? r : vf16{});
  }
  for (int s = s0; s < nv; s++) ds[s] = s < n ? p[s] * (ds[s] - dot) : 0.0f;
}

// Scores of query rows [r0, r1) against keys [0, r1) into S (m, np), np = round16(r1), and
// their softmax in place: S[t - r0][s] = P[t][s] for s <= t, 0 beyond (to np). The forward
// and the backward both call this, so the backward's P is bit-identical to the forward's.
// q: the packed (T, HSp) Q panel, row stride ldq; KT: the (HS, Tp) packed K^T. lse: row
// r0's entry of the head's (T) log-sum-exps to write, or null.
void softmax_block(float* S, float* lse, const float* q, int64_t ldq, const float* KT, int Tp, int HS, int r0, int r1,
                   float scale) {
  const int m = r1 - r0, np = round16(r1);
  small_gemm(m, np, HS, scale, q + static_cast<int64_t>(r0) * ldq, ldq, 1, KT, Tp, S, np, false);
  for (int t = r0; t < r1; t++) {
    float* srow = S + static_cast<size_t>(t - r0) * np;
    const int n = t + 1, n16 = round16(n);
    const float inv = softmax_row_exp(srow, n, n16, lse ? lse + (t - r0) : nullptr);
#pragma omp simd
    for (int s = 0; s < n16; s++) srow[s] *= inv;  // P (0 beyond t)
    for (int s = n16; s < np; s++) srow[s] = 0.0f;
  }
}

// Forward of one (b, h). q, k, v: (T, HS) views with row stride W (the qkv row); o: (T, HS)
// view with row stride C; lse: (T) this head's log-sum-exps. ctr0 = head_counter0(...) is the
// dropout counter of (t=0, s=0). In: the storage type of q, k, v and o (widened while packing,
// o rounded from the block's fp32 rows).
template <class In>
void forward_head(typename In::E* o, float* lse, const typename In::E* q, const typename In::E* k,
                  const typename In::E* v, int T, int C, int W, int HS, DropoutSpec drop, uint64_t ctr0) {
  const int C3 = W, HSp = round16(HS), Tp = round16(T), BQ = g_block_rows, MB = std::min(BQ, T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool dropout = drop.p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  float* KT = grow(0, static_cast<size_t>(HS) * Tp);   // (HS, Tp) K^T
  float* Vp = grow(1, static_cast<size_t>(T) * HSp);   // (T, HSp) V
  float* S = grow(2, static_cast<size_t>(MB) * Tp);    // (m, np)  the block's P, then Pd
  float* Ob = grow(3, static_cast<size_t>(MB) * HSp);  // (m, HSp) output rows
  float* keep = grow(4, static_cast<size_t>(Tp));
  float* Qp = grow(5, static_cast<size_t>(T) * HSp);   // (T, HSp) Q
  pack_transposed<In>(KT, k, C3, T, HS, Tp);
  pack_rows<In>(Vp, v, C3, T, HS, HSp);
  pack_rows<In>(Qp, q, C3, T, HS, HSp);
  for (int r0 = 0; r0 < T; r0 += BQ) {
    const int r1 = std::min(T, r0 + BQ), m = r1 - r0, np = round16(r1);
    // P[r0:r1, 0:r1] = softmax(scale Q[r0:r1] K[0:r1]^T)                 (m, np)
    softmax_block(S, lse + r0, Qp, HSp, KT, Tp, HS, r0, r1, scale);
    if (dropout) {
      for (int t = r0; t < r1; t++) {
        float* pd = S + static_cast<size_t>(t - r0) * np;
        const int n16 = round16(t + 1);
        dropout_factors(keep, n16, drop.key, ctr0 + static_cast<uint64_t>(t) * T, drop.p, kscale);
#pragma omp simd
        for (int s = 0; s < n16; s++) pd[s] *= keep[s];  // Pd (0 beyond t, and to np)
      }
    }
    // O[r0:r1] = Pd[r0:r1, 0:r1] V[0:r1]                              (m, HSp)
    small_gemm(m, HSp, r1, 1.0f, S, np, 1, Vp, HSp, Ob, HSp, false);
    for (int t = r0; t < r1; t++)
      store_row<In>(o + static_cast<int64_t>(t) * C, Ob + static_cast<size_t>(t - r0) * HSp, HS);
  }
}

// dq += this head's dQ; dk, dv += (add_kv) or = its dK, dV (see backward_head). For a 16-bit
// In, "+=" is one fold per element (tile_fold); dk, dv written (not added) are the fp32
// workspace's, whatever In.
template <class In>
void add_head_gradients(typename In::E* dq, void* dk_, void* dv_, int ldkv, bool add_kv, const float* dQp,
                        const float* dKp, const float* dVp, int T, int C3, int HS, int HSp) {
  using E = typename In::E;
  for (int t = 0; t < T; t++) {
    const size_t src = static_cast<size_t>(t) * HSp;
    const int64_t dst = static_cast<int64_t>(t) * C3, kdst = static_cast<int64_t>(t) * ldkv;
    if constexpr (In::t == DType::F32) {
#pragma omp simd
      for (int i = 0; i < HS; i++) dq[dst + i] += dQp[src + i];
    } else {
      tile_fold(dq + dst, dQp + src, In::t, HS);
    }
    if (add_kv) {
      E* dk = static_cast<E*>(dk_);
      E* dv = static_cast<E*>(dv_);
      if constexpr (In::t == DType::F32) {
#pragma omp simd
        for (int i = 0; i < HS; i++) {
          dk[kdst + i] += dKp[src + i];
          dv[kdst + i] += dVp[src + i];
        }
      } else {
        tile_fold(dk + kdst, dKp + src, In::t, HS);
        tile_fold(dv + kdst, dVp + src, In::t, HS);
      }
    } else {
      std::memcpy(static_cast<float*>(dk_) + kdst, dKp + src, sizeof(float) * HS);
      std::memcpy(static_cast<float*>(dv_) + kdst, dVp + src, sizeof(float) * HS);
    }
  }
}

// Backward of one (b, h). dq, dk, dv: views into dqkv (row stride W = ldkv), or dk, dv into
// a group's fp32 workspace (row stride ldkv = 2HS, written, not added); dO: view into dout (row
// stride C), q, k, v: views into qkv (row stride W), all of storage type In, widened while
// packing. P is recomputed block by block (softmax_block), as the forward computed it.
template <class In>
void backward_head(typename In::E* dq, void* dk, void* dv, int ldkv, bool add_kv, const typename In::E* dO,
                   const typename In::E* q, const typename In::E* k, const typename In::E* v, int T, int C, int W,
                   int HS, DropoutSpec drop, uint64_t ctr0) {
  const int C3 = W, HSp = round16(HS), Tp = round16(T), BQ = g_block_rows, MB = std::min(BQ, T);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const bool dropout = drop.p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - drop.p) : 1.0f;
  const size_t panel = static_cast<size_t>(T) * HSp;
  float* VT = grow(0, static_cast<size_t>(HS) * Tp);  // (HS, Tp) V^T
  float* Kp = grow(1, panel);                          // (T, HSp) K
  float* Qp = grow(2, panel);                          // (T, HSp) Q
  float* dOp = grow(3, panel);                         // (T, HSp) dO
  float* dQp = grow(4, panel);                         // (T, HSp) dQ, dK, dV for this head, added to dqkv at the end
                                                       // (dQ rows are written once, by their own block)
  float* dKp = grow(5, panel);
  float* dVp = grow(6, panel);
  float* dS = grow(7, static_cast<size_t>(MB) * Tp);   // (m, np) dPd, then dS
  float* Pd = grow(8, static_cast<size_t>(MB) * Tp);   // (m, np) P * M / (1-p)
  float* Mk = grow(9, static_cast<size_t>(MB) * Tp);   // (m, np) M / (1-p)
  float* KT = grow(10, static_cast<size_t>(HS) * Tp);  // (HS, Tp) K^T, for the scores
  float* Pb = grow(11, static_cast<size_t>(MB) * Tp);  // (m, np) the block's P, recomputed
  pack_transposed<In>(VT, v, C3, T, HS, Tp);
  pack_transposed<In>(KT, k, C3, T, HS, Tp);
  pack_rows<In>(Kp, k, C3, T, HS, HSp);
  pack_rows<In>(Qp, q, C3, T, HS, HSp);
  pack_rows<In>(dOp, dO, C, T, HS, HSp);
  std::memset(dKp, 0, sizeof(float) * panel);
  std::memset(dVp, 0, sizeof(float) * panel);
  for (int r0 = 0; r0 < T; r0 += BQ) {
    const int r1 = std::min(T, r0 + BQ), m = r1 - r0, np = round16(r1);
    softmax_block(Pb, nullptr, Qp, HSp, KT, Tp, HS, r0, r1, scale);  // P[r0:r1, 0:r1] (m, np)
    // A = Pd[r0:r1, 0:r1] as (m, r1): P, or P * M / (1-p).
    const float* A = Pb;
    if (dropout) {
      for (int t = r0; t < r1; t++) {
        const int n16 = round16(t + 1), nv = std::min(n16, T);
        float* mk = Mk + static_cast<size_t>(t - r0) * np;
        float* pd = Pd + static_cast<size_t>(t - r0) * np;
        const float* p = Pb + static_cast<size_t>(t - r0) * np;
        dropout_factors(mk, n16, drop.key, ctr0 + static_cast<uint64_t>(t) * T, drop.p, kscale);
#pragma omp simd
        for (int s = 0; s < nv; s++) pd[s] = p[s] * mk[s];  // P is 0 beyond t
        for (int s = nv; s < np; s++) pd[s] = 0.0f;
      }
      A = Pd;
    }
    // dV[0:r1] += Pd[r0:r1, 0:r1]^T dO[r0:r1]                        (r1, HSp)
    small_gemm(r1, HSp, m, 1.0f, A, 1, np, dOp + static_cast<size_t>(r0) * HSp, HSp, dVp, HSp, true);
    // dPd[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T                           (m, np)
    small_gemm(m, np, HS, 1.0f, dOp + static_cast<size_t>(r0) * HSp, HSp, 1, VT, Tp, dS, np, false);
    // dS = P * (dP - rowsum(dP * P)), dP = dPd * M / (1-p); 0 beyond the diagonal.
    for (int t = r0; t < r1; t++) {
      float* ds = dS + static_cast<size_t>(t - r0) * np;
      const float* p = Pb + static_cast<size_t>(t - r0) * np;
      const int n = t + 1, nv = std::min(round16(n), T);
      if (dropout) {
        const float* mk = Mk + static_cast<size_t>(t - r0) * np;
#pragma omp simd
        for (int s = 0; s < nv; s++) ds[s] *= mk[s];
      }
      softmax_row_backward(ds, p, n, nv);
      for (int s = nv; s < np; s++) ds[s] = 0.0f;
    }
    // dQ[r0:r1] += scale dS K[0:r1]                                    (m, HSp)
    small_gemm(m, HSp, r1, scale, dS, np, 1, Kp, HSp, dQp + static_cast<size_t>(r0) * HSp, HSp, false);
    // dK[0:r1] += scale dS^T Q[r0:r1]                                  (r1, HSp)
    small_gemm(r1, HSp, m, scale, dS, 1, np, Qp + static_cast<size_t>(r0) * HSp, HSp, dKp, HSp, true);
  }
  add_head_gradients<In>(dq, dk, dv, ldkv, add_kv, dQp, dKp, dVp, T, C3, HS, HSp);
}

void check_shapes(int B, int T, int C, Heads hd, DropoutSpec drop) {
  const int NH = hd.q;
  OPS_CHECK(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0 && hd.valid(),
               "attention: bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" +
                   std::to_string(C) + " NH=" + std::to_string(NH) + " NKV=" + std::to_string(hd.kv) + " group=" +
                   std::to_string(hd.group) + " first=" + std::to_string(hd.first) +
                   " (C must be a multiple of NH, every query head's key-value head in [0, NKV))");
  OPS_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "attention: dropout p must be in [0, 1), got " + std::to_string(drop.p));
  OPS_CHECK(drop.heads_total > 0 ? drop.head_start >= 0 && drop.head_start + NH <= drop.heads_total
                                    : drop.heads_total == 0 && drop.head_start == 0,
               "attention: head shard [" + std::to_string(drop.head_start) + ", " +
                   std::to_string(drop.head_start + NH) + ") outside heads_total=" + std::to_string(drop.heads_total));
}

// The dropout counter of (b, h, t=0, s=0): offset + (global head)*T*T, the global head being
// b*heads_total + head_start + h for a head shard, b*NH + h otherwise (ops/backend.h).
uint64_t head_counter0(const DropoutSpec& drop, int b, int h, int T, int NH) {
  const uint64_t heads = drop.heads_total > 0 ? static_cast<uint64_t>(drop.heads_total) : static_cast<uint64_t>(NH);
  const uint64_t g = static_cast<uint64_t>(b) * heads + static_cast<uint64_t>(drop.head_start) + static_cast<uint64_t>(h);
  return drop.offset + g * static_cast<uint64_t>(T) * static_cast<uint64_t>(T);
}

}  // namespace

int attention_block_rows() { return g_block_rows; }
void set_attention_block_rows(int rows) { g_block_rows = rows > 0 ? rows : 64; }

namespace {

// out: (B,T,C), lse: (B,NH,T), qkv: (B,T,W), W = C + 2 NKV HS; out and qkv of storage type In.
template <class In>
void forward_all(typename In::E* out, float* lse, const typename In::E* qkv, int B, int T, int C, Heads hd,
                 DropoutSpec drop) {
  check_shapes(B, T, C, hd, drop);
  const int NH = hd.q, HS = C / NH, W = C + 2 * hd.kv * HS, BH = B * NH;
  const bool par = BH > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const typename In::E* row = qkv + static_cast<size_t>(b) * T * W;
    const typename In::E* k = row + C + static_cast<size_t>(hd.kv_of(h)) * HS;
    typename In::E* o = out + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS;
    forward_head<In>(o, lse + static_cast<size_t>(bh) * T, row + static_cast<size_t>(h) * HS, k, k + hd.kv * HS, T, C,
                     W, HS, drop, head_counter0(drop, b, h, T, NH));
  }
}

// dK and dV of key-value head j of row b: += the group's panels in the workspace, in query
// head order (a fixed order: the sum does not depend on the thread count). work: (B,NH,T,2HS).
// For a 16-bit In the group's sum is made in fp32 from zero, in the same order, and folded
// once per element (tile_fold): the fp32 path's sum into a zeroed copy, then its fold.
template <class In>
void sum_group(typename In::E* dqkv, const float* work, int b, int j, int T, int C, int W, int HS, Heads hd) {
  typename In::E* dk = dqkv + static_cast<size_t>(b) * T * W + C + static_cast<size_t>(j) * HS;
  typename In::E* dv = dk + hd.kv * HS;
  if constexpr (In::t == DType::F32) {
    for (int h = hd.q_begin(j); h < hd.q_end(j); h++) {
      const float* w = work + (static_cast<size_t>(b) * hd.q + h) * T * 2 * HS;
      for (int t = 0; t < T; t++) {
        const float* wk = w + static_cast<size_t>(t) * 2 * HS;
        float* k = dk + static_cast<size_t>(t) * W;
        float* v = dv + static_cast<size_t>(t) * W;
#pragma omp simd
        for (int i = 0; i < HS; i++) {
          k[i] += wk[i];
          v[i] += wk[HS + i];
        }
      }
    }
  } else {
    float* acc = grow(0, static_cast<size_t>(2) * HS);  // [dK row | dV row], from zero
    for (int t = 0; t < T; t++) {
      std::fill(acc, acc + 2 * HS, 0.0f);
      for (int h = hd.q_begin(j); h < hd.q_end(j); h++) {
        const float* wk = work + ((static_cast<size_t>(b) * hd.q + h) * T + t) * 2 * HS;
#pragma omp simd
        for (int i = 0; i < 2 * HS; i++) acc[i] += wk[i];
      }
      tile_fold(dk + static_cast<size_t>(t) * W, acc, In::t, HS);
      tile_fold(dv + static_cast<size_t>(t) * W, acc + HS, In::t, HS);
    }
  }
}

// dqkv: (B,T,W) +=, dout: (B,T,C), qkv: (B,T,W), of storage type In; work (B,NH,T,2HS) fp32
// when hd.group > 1.
template <class In>
void backward_all(typename In::E* dqkv, const typename In::E* dout, const typename In::E* qkv, int B, int T, int C,
                  Heads hd, DropoutSpec drop, float* work) {
  check_shapes(B, T, C, hd, drop);
  const int NH = hd.q, HS = C / NH, W = C + 2 * hd.kv * HS, BH = B * NH;
  const bool grouped = hd.group > 1;
  OPS_CHECK(!grouped || work, "attention_backward: grouped-query attention needs its workspace");
  const bool par = BH > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bh = 0; bh < BH; bh++) {
    const int b = bh / NH, h = bh % NH;
    const size_t qoff = static_cast<size_t>(b) * T * W + static_cast<size_t>(h) * HS;
    const size_t koff = static_cast<size_t>(b) * T * W + C + static_cast<size_t>(hd.kv_of(h)) * HS;
    const typename In::E* dO = dout + static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * HS;
    const uint64_t ctr0 = head_counter0(drop, b, h, T, NH);
    void* dk = grouped ? static_cast<void*>(work + static_cast<size_t>(bh) * T * 2 * HS) : dqkv + koff;
    void* dv = grouped ? static_cast<void*>(static_cast<float*>(dk) + HS) : dqkv + koff + static_cast<size_t>(hd.kv) * HS;
    backward_head<In>(dqkv + qoff, dk, dv, grouped ? 2 * HS : W, !grouped, dO, qkv + qoff, qkv + koff,
                      qkv + koff + static_cast<size_t>(hd.kv) * HS, T, C, W, HS, drop, ctr0);
  }
  if (!grouped) return;
  const int BK = B * hd.kv;
  const bool par2 = BK > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par2)
  for (int bj = 0; bj < BK; bj++) sum_group<In>(dqkv, work, bj / hd.kv, bj % hd.kv, T, C, W, HS, hd);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads hd, DropoutSpec drop) {
  forward_all<InF32>(out, lse, qkv, B, T, C, hd, drop);
}

// lse (B,NH,T), the forward's, is not read: the CPU recomputes each row's statistics exactly as
// its forward did (ops/backend.h).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* /*lse*/, int B, int T, int C,
                        Heads hd, DropoutSpec drop, float* work) {
  if (!dqkv) return;
  backward_all<InF32>(dqkv, dout, qkv, B, T, C, hd, drop, work);
}

// The same kernels on 16-bit storage (t: BF16 or F16).
void attention_forward16(void* out, float* lse, const void* qkv, DType t, int B, int T, int C, Heads hd,
                         DropoutSpec drop) {
  OPS_CHECK(t == DType::BF16 || t == DType::F16, std::string("attention_forward16: no ") + dtype_name(t));
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(qkv);
  if (t == DType::BF16) forward_all<InBF16>(o, lse, x, B, T, C, hd, drop);
  else forward_all<InF16>(o, lse, x, B, T, C, hd, drop);
}
void attention_backward16(void* dqkv, const void* dout, const void* qkv, const float* /*lse*/, DType t, int B, int T,
                          int C, Heads hd, DropoutSpec drop, float* work) {
  if (!dqkv) return;
  OPS_CHECK(t == DType::BF16 || t == DType::F16, std::string("attention_backward16: no ") + dtype_name(t));
  auto* d = static_cast<uint16_t*>(dqkv);
  const auto* dO = static_cast<const uint16_t*>(dout);
  const auto* x = static_cast<const uint16_t*>(qkv);
  if (t == DType::BF16) backward_all<InBF16>(d, dO, x, B, T, C, hd, drop, work);
  else backward_all<InF16>(d, dO, x, B, T, C, hd, drop, work);
}

// ============================================================================ the KV cache
// Decode reads one query row against p+1 cached rows per (b, h): a matrix-vector product, so
// plain dot products beat packing panels. The cache's format is decoded into per-thread fp32
// scratch (K and V rows of the head), then: s_j = scale q.k_j, P = softmax(s) with the same
// exp as the full attention's softmax (vecmath.h), o = sum_j P_j v_j.

namespace {

// Stores one head's HS values at element `at` of a K or V buffer (scales: element `sat`).
inline void kv_store_head(const KvView& kv, void* buf, float* scales, size_t at, size_t sat, const float* x, int HS) {
  switch (kv.dtype) {
    case DType::F32: std::memcpy(static_cast<float*>(buf) + at, x, sizeof(float) * HS); break;
    case DType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(buf) + at;
      for (int i = 0; i < HS; i++) d[i] = f32_to_bf16(x[i]);
      break;
    }
    case DType::F16: {
      uint16_t* d = static_cast<uint16_t*>(buf) + at;
      for (int i = 0; i < HS; i++) d[i] = f32_to_f16(x[i]);
      break;
    }
    case DType::I8: {
      float mx = 0.0f;
      for (int i = 0; i < HS; i++) mx = std::max(mx, std::fabs(x[i]));
      const float scale = mx / 127.0f, inv = mx > 0 ? 127.0f / mx : 0.0f;
      int8_t* d = static_cast<int8_t*>(buf) + at;
      for (int i = 0; i < HS; i++) d[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
      scales[sat] = scale;
      break;
    }
    default: OPS_CHECK(false, std::string("KV cache: no ") + dtype_name(kv.dtype) + " format");
  }
}

// Reads n positions [0, n) of key-value head j of row b into dst (n, HS) fp32. The cache
// holds NKV heads of HS channels per position.
inline void kv_load_head(float* dst, const KvView& kv, const void* buf, const float* scales, int b, int j, int n,
                         int HS, int NKV) {
  const size_t row0 = static_cast<size_t>(b) * kv.context, Ckv = static_cast<size_t>(NKV) * HS;
  for (int p = 0; p < n; p++) {
    const size_t at = (row0 + p) * Ckv + static_cast<size_t>(j) * HS;
    float* d = dst + static_cast<size_t>(p) * HS;
    switch (kv.dtype) {
      case DType::F32: std::memcpy(d, static_cast<const float*>(buf) + at, sizeof(float) * HS); break;
      case DType::BF16: {
        const uint16_t* s = static_cast<const uint16_t*>(buf) + at;
        for (int i = 0; i < HS; i++) d[i] = bf16_to_f32(s[i]);
        break;
      }
      case DType::F16: {
        const uint16_t* s = static_cast<const uint16_t*>(buf) + at;
        for (int i = 0; i < HS; i++) d[i] = f16_to_f32(s[i]);
        break;
      }
      case DType::I8: {
        const int8_t* s = static_cast<const int8_t*>(buf) + at;
        const float sc = scales[(row0 + p) * NKV + j];
        for (int i = 0; i < HS; i++) d[i] = static_cast<float>(s[i]) * sc;
        break;
      }
      default: break;
    }
  }
}

// K and V of row b's token at position p (its qkv row: [q: C | k: NKV*HS | v: NKV*HS]) into
// the cache.
inline void kv_store_position(const KvView& kv, const float* qkv_row, int b, int64_t p, int C, int HS, int NKV) {
  const size_t rowpos = static_cast<size_t>(b) * kv.context + static_cast<size_t>(p);
  const int Ckv = NKV * HS;
  for (int j = 0; j < NKV; j++) {
    const size_t at = rowpos * Ckv + static_cast<size_t>(j) * HS, sat = rowpos * NKV + j;
    kv_store_head(kv, kv.k, kv.k_scale, at, sat, qkv_row + C + j * HS, HS);
    kv_store_head(kv, kv.v, kv.v_scale, at, sat, qkv_row + C + Ckv + j * HS, HS);
  }
}

}  // namespace

// qkv: (B,T,W); positions [0, T) of rows [0, B)
void kv_cache_write(KvView kv, const float* qkv, int B, int T, int C, Heads hd) {
  OPS_CHECK(T <= kv.context, "KV cache: " + std::to_string(T) + " positions over its context of " + std::to_string(kv.context));
  OPS_CHECK(hd.q > 0 && C % hd.q == 0 && hd.valid(), "kv_cache_write: bad heads");
  const int HS = C / hd.q, W = C + 2 * hd.kv * HS;
  const int64_t N = static_cast<int64_t>(B) * T;
  const bool par = N > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < N; r++)
    kv_store_position(kv, qkv + r * W, static_cast<int>(r / T), r % T, C, HS, hd.kv);
}

// out: (B,C), qkv: (B,W) roped, pos: (B). One unit per (row, key-value head): its cached K and
// V are decoded once and serve every query head of its group.
void attention_decode(float* out, const float* qkv, KvView kv, const int32_t* pos, int B, int C, Heads hd) {
  OPS_CHECK(hd.q > 0 && C % hd.q == 0 && hd.valid(), "attention_decode: C % NH != 0 or bad key-value heads");
  const int HS = C / hd.q, W = C + 2 * hd.kv * HS;
  for (int b = 0; b < B; b++) {
    OPS_CHECK(pos[b] >= 0 && pos[b] < kv.context, "attention_decode: position " + std::to_string(pos[b]) +
                                                      " outside the KV cache's context of " + std::to_string(kv.context));
    kv_store_position(kv, qkv + static_cast<size_t>(b) * W, b, pos[b], C, HS, hd.kv);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int BK = B * hd.kv;
  const bool par = BK > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int bj = 0; bj < BK; bj++) {
    const int b = bj / hd.kv, j = bj % hd.kv, n = pos[b] + 1, n16 = round16(n);
    if (hd.q_begin(j) >= hd.q_end(j)) continue;  // replicated key-value heads: none of this rank's queries read it
    float* K = grow(0, static_cast<size_t>(n) * HS);
    float* V = grow(1, static_cast<size_t>(n) * HS);
    float* s = grow(2, static_cast<size_t>(n16));
    kv_load_head(K, kv, kv.k, kv.k_scale, b, j, n, HS, hd.kv);
    kv_load_head(V, kv, kv.v, kv.v_scale, b, j, n, HS, hd.kv);
    for (int h = hd.q_begin(j); h < hd.q_end(j); h++) {
      const float* q = qkv + static_cast<size_t>(b) * W + static_cast<size_t>(h) * HS;
      for (int p = 0; p < n; p++) {
        const float* k = K + static_cast<size_t>(p) * HS;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int i = 0; i < HS; i++) d += q[i] * k[i];
        s[p] = d * scale;
      }
      const float inv = softmax_row_exp(s, n, n16);
      float* o = out + static_cast<size_t>(b) * C + static_cast<size_t>(h) * HS;
      std::fill(o, o + HS, 0.0f);
      for (int p = 0; p < n; p++) {
        const float w = s[p] * inv;
        const float* v = V + static_cast<size_t>(p) * HS;
#pragma omp simd
        for (int i = 0; i < HS; i++) o[i] += w * v[i];
      }
    }
  }
}

}  // namespace ops::cpu
