// The optimizer phase on the CPU (see adamw.h).
//
// Why fused: AdamW is memory-bound. The old phase made up to four passes over the parameters'
// memory (the update, the masters' rounding to the 16-bit copy, a separate zeroing of the
// gradients, and for 16-bit ranges all of it on one thread in 2^14-element pieces). Here one
// threaded pass walks fixed blocks; within a block, small sub-pieces are widened into L1
// scratch, updated with the one adamw_range, rounded back and the gradient zeroed while its
// lines are still cached. The per-element arithmetic and every conversion are the old path's
// (same functions or the same scalar rules, same AVX-512 / scalar split at 16-element
// boundaries from the range's start), so the results are bit-identical to it.
#include "ops/cpu/adamw.h"
#include "ops/adamw_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/check.h"
#include "ops/convert.h"
#include "ops/cpu/tile_convert.h"
#include "ops/cpu/vecmath.h"

// GCC 12 warns "__Y may be used uninitialized" inside its own _mm512_sqrt_ps, _mm512_cvtph_ps
// and _mm512_cvtps_ph, a known false positive of its _mm512_undefined_ps: silenced for this
// file, which holds only these kernels.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ops::cpu {

// GCC does not vectorize a loop calling sqrt unless -fno-math-errno is on (it keeps a scalar
// errno path for negative inputs), so the AVX-512 body is written with intrinsics; vsqrtps is
// correctly rounded like sqrtf, so both paths compute the same function. The remainder (and
// other ISAs) run the scalar loop.
void adamw_range(float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                 int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float inv_bc1,
                 float inv_bc2, float grad_scale) {
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 vgs = _mm512_set1_ps(grad_scale), vb1 = _mm512_set1_ps(beta1), vb2 = _mm512_set1_ps(beta2),
               va1 = _mm512_set1_ps(a1), va2 = _mm512_set1_ps(a2), vc1 = _mm512_set1_ps(inv_bc1),
               vc2 = _mm512_set1_ps(inv_bc2), veps = _mm512_set1_ps(eps), vlr = _mm512_set1_ps(lr),
               vwd = _mm512_set1_ps(weight_decay);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), vgs);
    const __m512 mi = _mm512_fmadd_ps(vb1, _mm512_loadu_ps(m + i), _mm512_mul_ps(va1, g));
    const __m512 vi = _mm512_fmadd_ps(vb2, _mm512_loadu_ps(v + i), _mm512_mul_ps(_mm512_mul_ps(va2, g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 mhat = _mm512_mul_ps(mi, vc1), vhat = _mm512_mul_ps(vi, vc2);
    const __m512 p = _mm512_loadu_ps(param + i);
    const __m512 upd = _mm512_fmadd_ps(vwd, p, _mm512_div_ps(mhat, _mm512_add_ps(_mm512_sqrt_ps(vhat), veps)));
    _mm512_storeu_ps(param + i, _mm512_fnmadd_ps(vlr, upd, p));
  }
#endif
  for (; i < n; i++)
    param[i] = adamw_element(param[i], grad[i] * grad_scale, m[i], v[i], lr, beta1, beta2, a1, a2, eps, weight_decay,
                             inv_bc1, inv_bc2);
}

double sum_squares_range(const float* __restrict x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; i++) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

namespace {

// Elements widened at a time inside a block: two fp32 scratch pieces (16 KiB) stay in L1.
// A multiple of 16 (the vector split) that divides kOptBlock.
constexpr int64_t kSub = 2048;
static_assert(kOptBlock % kSub == 0 && kSub % 16 == 0);

// One call's operands, at the range's start, and its bias corrections.
struct Fused {
  char* param;
  DType pt;
  char* grad;
  DType gt;
  float* master;
  float* m;
  float* v;
  Backend::AdamwArgs a;
  float inv_bc1, inv_bc2;
  bool zero_grad;

  void update(float* w, const float* g, int64_t i, int64_t k) const {
    adamw_range(w, g, m + i, v + i, k, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, inv_bc1, inv_bc2, a.grad_scale);
  }
  void zero(int64_t i, int64_t k) const {
    if (zero_grad) std::memset(grad + i * dtype_size(gt), 0, static_cast<size_t>(k) * dtype_size(gt));
  }
  // Elements [i0, i1) (one fixed block). fp32 throughout: the block in place, then its
  // gradient zeroed (still in L2). Otherwise L1 pieces: the 16-bit operands widened, the
  // update, the 16-bit copy rounded, the gradient piece zeroed.
  void block(int64_t i0, int64_t i1) const {
    auto* pf = reinterpret_cast<float*>(param);
    auto* gf = reinterpret_cast<float*>(grad);
    if (pt == DType::F32 && gt == DType::F32 && !master) {
      update(pf + i0, gf + i0, i0, i1 - i0);
      zero(i0, i1 - i0);
      return;
    }
    auto* p16 = reinterpret_cast<uint16_t*>(param);
    auto* g16 = reinterpret_cast<const uint16_t*>(grad);
    alignas(64) float wbuf[kSub], gbuf[kSub];
    for (int64_t i = i0; i < i1; i += kSub) {
      const int64_t k = std::min(kSub, i1 - i);
      float* w = master ? master + i : (pt == DType::F32 ? pf + i : wbuf);
      if (!master && pt != DType::F32) tile_to_f32(wbuf, p16 + i, pt, k);
      const float* g = gt == DType::F32 ? gf + i : gbuf;
      if (gt != DType::F32) tile_to_f32(gbuf, g16 + i, gt, k);
      update(w, g, i, k);
      if (pt != DType::F32) tile_from_f32(p16 + i, w, pt, k);  // the compute copy
      zero(i, k);
    }
  }
};

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace

// Bias corrections in double, as CpuBackend::adamw_update computes them (the same floats).
void adamw_update_fused(void* param, DType pt, void* grad, DType gt, float* master, float* m, float* v, int64_t n,
                        const Backend::AdamwArgs& a, bool zero_grad) {
  OPS_CHECK(is_float(pt) && is_float(gt), std::string("adamw_update: ") + dtype_name(pt) + " parameter, " +
                                              dtype_name(gt) + " gradient");
  OPS_CHECK(a.t >= 1, "adamw_update: step t must be >= 1, got " + std::to_string(a.t));
  if (n <= 0) return;
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.t))));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.t))));
  const Fused f{static_cast<char*>(param), pt, static_cast<char*>(grad), gt, master, m, v, a, inv_bc1, inv_bc2,
                zero_grad};
  parallel_blocks(n, kOptBlock, [&f](int64_t i0, int64_t i1, int) { f.block(i0, i1); });
}

double sum_squares16(const void* x, DType t, int64_t n) {
  OPS_CHECK(t == DType::BF16 || t == DType::F16, std::string("sum_squares16 of ") + dtype_name(t));
  if (n <= 0) return 0;
  std::vector<double> part(static_cast<size_t>(num_blocks(n, kOptBlock)), 0.0);
  double* pp = part.data();
  const auto* s = static_cast<const uint16_t*>(x);
  parallel_blocks(n, kOptBlock, [=](int64_t i0, int64_t i1, int blk) {
    alignas(64) float buf[kOptBlock];  // 64 KiB of the thread's stack: the block widened once
    tile_to_f32(buf, s + i0, t, i1 - i0);
    pp[blk] = sum_squares_range(buf, i1 - i0);
  });
  double total = 0.0;
  for (double p : part) total += p;
  return total;
}

void mem_zero(void* p, size_t bytes) {
  // Below a few MiB one thread's memset is as fast as waking the team.
  constexpr int64_t kParallelBytes = int64_t{1} << 22, kChunk = int64_t{1} << 20;
  if (!bytes) return;
  char* c = static_cast<char*>(p);
  if (static_cast<int64_t>(bytes) < kParallelBytes) {
    std::memset(c, 0, bytes);
    return;
  }
  parallel_chunks(static_cast<int64_t>(bytes), kChunk, [c](int64_t b, int64_t e) {
    std::memset(c + b, 0, static_cast<size_t>(e - b));
  }, 64);
}

}  // namespace ops::cpu
