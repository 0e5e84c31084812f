// The CPU backend: every kernel of ops/backend.h, forward and backward side by side.
//
// GEMMs go to OpenBLAS (its OpenMP build, so BLAS and these loops share one thread pool);
// everything else is a plain loop written so that GCC vectorizes it (`#pragma omp simd`,
// the exp_f of vecmath.h instead of libm's scalar expf) and split across the OpenMP team
// only when the work repays a parallel region (parallel_chunks). Attention lives in
// attention.cpp. Conventions (ops/backend.h): every backward accumulates (+=) into its
// gradients except softmax_xent_backward, which overwrites; a null gradient pointer skips
// that gradient's work.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/vecmath.h"
#include "ops/rng.h"
#include "runner/errors.h"

namespace ops {
namespace cpu {
namespace {

// Minimum elements per thread before an elementwise loop goes parallel: ~64 KiB of
// streaming per thread, which takes about as long as waking a passive OpenMP worker.
constexpr int64_t kGrainStream = 1 << 14;
// The same for loops that spend ~10+ flops per element (exp, sqrt, division).
constexpr int64_t kGrainMath = 1 << 12;

// Rows per thread so that each thread gets at least `grain` elements of a (rows, C) tensor.
int64_t row_grain(int64_t C, int64_t grain) { return std::max<int64_t>(1, grain / std::max<int64_t>(C, 1)); }

// Per-thread partial sums of a reduction over rows (dweight, dbias), folded into dst after.
struct Partials {
  std::vector<float> buf;
  int nt = 1;
  int64_t width = 0;
  Partials(int64_t width_) : width(width_) {
    nt = std::max(1, omp_get_max_threads());
    buf.assign(static_cast<size_t>(nt) * width, 0.0f);
  }
  float* slot(int i) { return buf.data() + static_cast<size_t>(i) * width; }
  // dst[j] += sum over threads of slot[j] for j in [off, off+n)
  void fold(float* dst, int64_t off, int64_t n) {
    if (!dst) return;
    for (int i = 0; i < nt; i++) {
      const float* s = slot(i) + off;
#pragma omp simd
      for (int64_t j = 0; j < n; j++) dst[j] += s[j];
    }
  }
};

// Runs f(r0, r1, tid) over row ranges, each thread one contiguous range; tid indexes Partials.
template <class F>
void parallel_rows(int64_t N, int64_t min_rows, F&& f) {
  parallel_chunks(N, min_rows, [=](int64_t r0, int64_t r1) { f(r0, r1, omp_get_thread_num()); }, 1);
}

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }

  // ---------------------------------------------------------------- embedding
  // out: (B,T,C), tokens: (B,T), wte: (V,C), wpe: (maxT,C) or null
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                         int C) override {
    const int64_t N = static_cast<int64_t>(B) * T;
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        float* o = out + r * C;
        const float* w = wte + static_cast<int64_t>(tokens[r]) * C;
        if (wpe) {
          const float* p = wpe + (r % T) * C;
#pragma omp simd
          for (int i = 0; i < C; i++) o[i] = w[i] + p[i];
        } else {
          std::memcpy(o, w, sizeof(float) * C);
        }
      }
    }, 1);
  }
  // dwte: (V,C) +=, dwpe: (maxT,C) +=, dout: (B,T,C)
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override {
    if (!dwte && !dwpe) return;
    const int64_t N = static_cast<int64_t>(B) * T;
    // Tokens repeat, so rows of dwte collide: split the channels, not the rows, across threads.
    parallel_chunks(C, std::max<int64_t>(16, kGrainStream / std::max<int64_t>(N, 1)), [=](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < N; r++) {
        const float* d = dout + r * C;
        if (dwte) {
          float* w = dwte + static_cast<int64_t>(tokens[r]) * C;
#pragma omp simd
          for (int64_t i = c0; i < c1; i++) w[i] += d[i];
        }
        if (dwpe) {
          float* p = dwpe + (r % T) * C;
#pragma omp simd
          for (int64_t i = c0; i < c1; i++) p[i] += d[i];
        }
      }
    });
  }

  // ---------------------------------------------------------------- layernorm
  // out: (N,C), mean, rstd: (N), inp: (N,C), weight, bias: (C) (null = ones / zeros)
  // Ba, Kiros & Hinton 2016: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps).
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, float eps) override {
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const float* x = inp + r * C;
        float* o = out + r * C;
        // Two passes (mean, then squared deviations) rather than E[x^2]-E[x]^2, which
        // cancels catastrophically in fp32 when |mean| >> std.
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int i = 0; i < C; i++) s += x[i];
        const float m = s / C;
        float v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        const float rs = 1.0f / std::sqrt(v / C + eps);
        if (weight && bias) {
#pragma omp simd
          for (int i = 0; i < C; i++) o[i] = (x[i] - m) * rs * weight[i] + bias[i];
        } else {
#pragma omp simd
          for (int i = 0; i < C; i++) o[i] = (x[i] - m) * rs * (weight ? weight[i] : 1.0f) + (bias ? bias[i] : 0.0f);
        }
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
      }
    }, 1);
  }
  // dinp: (N,C) +=, dweight, dbias: (C) +=, dout, inp: (N,C), mean, rstd: (N)
  // With xhat = (x - mean) rstd and g = w * dout:
  //   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw = sum_rows dout xhat,  db = sum_rows dout.
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    if (!dinp && !dweight && !dbias) return;
    Partials part(2 * static_cast<int64_t>(C));  // [dweight | dbias] per thread
    parallel_rows(N, row_grain(C, kGrainStream), [=, &part](int64_t r0, int64_t r1, int tid) {
      float* pw = part.slot(tid);
      float* pb = pw + C;
      for (int64_t r = r0; r < r1; r++) {
        const float* x = inp + r * C;
        const float* dy = dout + r * C;
        const float m = mean[r], rs = rstd[r];
        if (dinp) {
          float g_mean = 0.0f, gx_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, gx_mean)
          for (int i = 0; i < C; i++) {
            const float g = (weight ? weight[i] : 1.0f) * dy[i];
            g_mean += g;
            gx_mean += g * (x[i] - m) * rs;
          }
          g_mean /= C;
          gx_mean /= C;
          float* dx = dinp + r * C;
#pragma omp simd
          for (int i = 0; i < C; i++) {
            const float g = (weight ? weight[i] : 1.0f) * dy[i];
            dx[i] += rs * (g - g_mean - (x[i] - m) * rs * gx_mean);
          }
        }
        if (dweight) {
#pragma omp simd
          for (int i = 0; i < C; i++) pw[i] += dy[i] * (x[i] - m) * rs;
        }
        if (dbias) {
#pragma omp simd
          for (int i = 0; i < C; i++) pb[i] += dy[i];
        }
      }
    });
    part.fold(dweight, 0, C);
    part.fold(dbias, C, C);
  }

  // ---------------------------------------------------------------- rmsnorm
  // out: (N,C), rstd: (N), inp: (N,C), weight: (C) (null = ones)
  // Zhang & Sennrich 2019: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) override {
    parallel_chunks(N, row_grain(C, kGrainStream), [=](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const float* x = inp + r * C;
        float* o = out + r * C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < C; i++) ss += x[i] * x[i];
        const float rs = 1.0f / std::sqrt(ss / C + eps);
#pragma omp simd
        for (int i = 0; i < C; i++) o[i] = x[i] * rs * (weight ? weight[i] : 1.0f);
        if (rstd) rstd[r] = rs;
      }
    }, 1);
  }
  // dinp: (N,C) +=, dweight: (C) +=. With xhat = x rstd and g = w dout:
  //   dx = rstd (g - xhat mean(g xhat)),  dw = sum_rows dout xhat.
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) override {
    if (!dinp && !dweight) return;
    Partials part(C);
    parallel_rows(N, row_grain(C, kGrainStream), [=, &part](int64_t r0, int64_t r1, int tid) {
      float* pw = part.slot(tid);
      for (int64_t r = r0; r < r1; r++) {
        const float* x = inp + r * C;
        const float* dy = dout + r * C;
        const float rs = rstd[r];
        if (dinp) {
          float gx_mean = 0.0f;
#pragma omp simd reduction(+ : gx_mean)
          for (int i = 0; i < C; i++) gx_mean += (weight ? weight[i] : 1.0f) * dy[i] * x[i] * rs;
          gx_mean /= C;
          float* dx = dinp + r * C;
#pragma omp simd
          for (int i = 0; i < C; i++) dx[i] += rs * ((weight ? weight[i] : 1.0f) * dy[i] - x[i] * rs * gx_mean);
        }
        if (dweight) {
#pragma omp simd
          for (int i = 0; i < C; i++) pw[i] += dy[i] * x[i] * rs;
        }
      }
    });
    part.fold(dweight, 0, C);
  }

  // ---------------------------------------------------------------- matmul
  // out: (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC)
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC) override {
    float beta = 0.0f;
    if (bias) {
      // Prefill with the bias and let the GEMM accumulate (beta = 1): the same memory
      // traffic as OpenBLAS zeroing C for beta = 0, and no extra pass afterwards.
      parallel_chunks(N, row_grain(OC, kGrainStream), [=](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) std::memcpy(out + r * OC, bias, sizeof(float) * OC);
      }, 1);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
  }
  // dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp; dbias (OC) += colsum(dout)
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC) override {
    if (dinp)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    if (dweight)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
      // Threads own disjoint column ranges and sweep all rows, so no partials are needed.
      parallel_chunks(OC, std::max<int64_t>(16, kGrainStream / std::max(N, 1)), [=](int64_t c0, int64_t c1) {
        for (int64_t r = 0; r < N; r++) {
          const float* d = dout + r * OC;
#pragma omp simd
          for (int64_t j = c0; j < c1; j++) dbias[j] += d[j];
        }
      });
    }
  }

  // ---------------------------------------------------------------- rope
  // out, inp: (B,T,3C). Su et al. 2021 (RoFormer), "rotate half" pairing (i, i + HS/2).
  void rope_forward(float* out, const float* inp, int B, int T, int C, int NH, float theta) override {
    rope_apply(out, inp, B, T, C, NH, theta, /*inverse=*/false, /*accumulate=*/false);
  }
  // dinp += R^T dout: a rotation's adjoint is the rotation by -a; v's gradient passes through.
  void rope_backward(float* dinp, const float* dout, int B, int T, int C, int NH, float theta) override {
    if (!dinp) return;
    rope_apply(dinp, dout, B, T, C, NH, theta, /*inverse=*/true, /*accumulate=*/true);
  }

  // ---------------------------------------------------------------- attention
  void attention_forward(float* out, float* probs, const float* qkv, int B, int T, int C, int NH,
                         DropoutSpec drop) override {
    cpu::attention_forward(out, probs, qkv, B, T, C, NH, drop);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* probs, int B, int T, int C,
                          int NH, DropoutSpec drop) override {
    cpu::attention_backward(dqkv, dout, qkv, probs, B, T, C, NH, drop);
  }

  // ---------------------------------------------------------------- gelu
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) out[i] = gelu_f(inp[i]);
    });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    if (!dinp) return;
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) dinp[i] += dout[i] * gelu_grad_f(inp[i]);
    });
  }

  // ---------------------------------------------------------------- swiglu
  // inp: (N, 2H) = [gate | up], out: (N, H) = silu(gate) * up (Shazeer 2020).
  // silu(g) = g s, s = sigmoid(g); silu'(g) = s (1 + g (1 - s)).
  void swiglu_forward(float* out, const float* inp, int N, int H) override {
    parallel_chunks(N, row_grain(H, kGrainMath), [=](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const float* g = inp + r * 2 * H;
        const float* u = g + H;
        float* o = out + r * H;
#pragma omp simd
        for (int i = 0; i < H; i++) o[i] = g[i] * sigmoid_f(g[i]) * u[i];
      }
    }, 1);
  }
  // dinp: (N, 2H) +=, dout: (N, H)
  void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) override {
    if (!dinp) return;
    parallel_chunks(N, row_grain(H, kGrainMath), [=](int64_t r0, int64_t r1) {
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
    }, 1);
  }

  // ---------------------------------------------------------------- add
  void add_forward(float* out, const float* a, const float* b, int64_t n) override {
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) out[i] = a[i] + b[i];
    });
  }
  void add_inplace(float* dst, const float* src, int64_t n) override {
    if (!dst) return;
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) dst[i] += src[i];
    });
  }

  // ---------------------------------------------------------------- dropout
  // Inverted dropout (Srivastava et al. 2014, scaled at train time): out = inp * keep / (1-p).
  void dropout_forward(float* out, const float* inp, int64_t n, DropoutSpec drop) override {
    if (drop.p <= 0.0f) {
      if (out != inp) parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) {
        std::memcpy(out + i0, inp + i0, sizeof(float) * (i1 - i0));
      });
      return;
    }
    const float p = drop.p, ks = drop.p < 1.0f ? 1.0f / (1.0f - drop.p) : 0.0f;
    const uint64_t key = drop.key;
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++)
        out[i] = rng_uniform(key, static_cast<uint64_t>(i)) >= p ? inp[i] * ks : 0.0f;
    });
  }
  void dropout_backward(float* dinp, const float* dout, int64_t n, DropoutSpec drop) override {
    if (!dinp) return;
    if (drop.p <= 0.0f) return add_inplace(dinp, dout, n);
    const float p = drop.p, ks = drop.p < 1.0f ? 1.0f / (1.0f - drop.p) : 0.0f;
    const uint64_t key = drop.key;
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++)
        dinp[i] += rng_uniform(key, static_cast<uint64_t>(i)) >= p ? dout[i] * ks : 0.0f;
    });
  }

  // ---------------------------------------------------------------- softmax cross-entropy
  // losses: (N), probs: (N,V) (may alias logits), logits: (N,V), targets: (N)
  // loss = logsumexp(x) - x[target], computed as log(sum exp(x - max)) - (x[target] - max).
  void softmax_xent_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V,
                            int Vreal) override {
    RUNNER_CHECK(Vreal > 0 && Vreal <= V, "softmax_xent: need 0 < Vreal <= V, got Vreal=" + std::to_string(Vreal) +
                                              " V=" + std::to_string(V));
    const bool par = N > 1 && static_cast<int64_t>(N) * Vreal >= 2 * kGrainMath && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < N; r++) {
      const float* x = logits + static_cast<int64_t>(r) * V;
      float* p = probs + static_cast<int64_t>(r) * V;
      const int tgt = targets[r];
      RUNNER_CHECK(tgt < Vreal, "softmax_xent: target " + std::to_string(tgt) + " >= Vreal " + std::to_string(Vreal));
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
  // dlogits (N,V) = (probs - onehot(target)) * dloss, OVERWRITTEN; may alias probs.
  void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V,
                             int Vreal) override {
    if (!dlogits) return;
    const bool par = N > 1 && static_cast<int64_t>(N) * V >= 2 * kGrainStream && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (par)
    for (int r = 0; r < N; r++) {
      const float* p = probs + static_cast<int64_t>(r) * V;
      float* d = dlogits + static_cast<int64_t>(r) * V;
      const int tgt = targets[r];
      if (tgt < 0) {
        std::memset(d, 0, sizeof(float) * V);
        continue;
      }
#pragma omp simd
      for (int i = 0; i < Vreal; i++) d[i] = p[i] * dloss;
      for (int i = Vreal; i < V; i++) d[i] = 0.0f;
      d[tgt] -= dloss;
    }
  }

  // ---------------------------------------------------------------- optimizer
  // AdamW (Loshchilov & Hutter 2019, Algorithm 2), bias-corrected, decoupled weight decay.
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t t, float grad_scale) override {
    RUNNER_CHECK(t >= 1, "adamw_update: step t must be >= 1, got " + std::to_string(t));
    const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t))));
    const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t))));
    const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
    parallel_chunks(n, kGrainMath, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + a1 * g;
        const float vi = beta2 * v[i] + a2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi * inv_bc1, vhat = vi * inv_bc2;
        param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
      }
    });
  }

  double sum_squares(const float* x, int64_t n) override {
    double total = 0.0;
    const bool par = n >= 2 * kGrainStream && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (par)
    for (int64_t i = 0; i < n; i++) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    return total;
  }

  void scale(float* x, int64_t n, float s) override {
    parallel_chunks(n, kGrainStream, [=](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; i++) x[i] *= s;
    });
  }

 private:
  // cos/sin of t * theta^(-2i/HS) for t < T, i < HS/2, computed in double (an fp32 angle
  // t * f would be off by ~t * 6e-8 rad) and cached: the table depends only on (T, HS, theta).
  struct RopeTable {
    int T = 0, HS = 0;
    float theta = 0.0f;
    std::vector<float> cos, sin;  // (T, HS/2)
  };
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

  // dst (+)= R(+-a) src on q and k; v copied (or accumulated).
  void rope_apply(float* dst, const float* src, int B, int T, int C, int NH, float theta, bool inverse,
                  bool accumulate) {
    RUNNER_CHECK(NH > 0 && C % NH == 0 && (C / NH) % 2 == 0,
                 "rope: head size C/NH must be even, got C=" + std::to_string(C) + " NH=" + std::to_string(NH));
    const int HS = C / NH, half = HS / 2;
    const std::shared_ptr<const RopeTable> tabp = rope_table(T, HS, theta);
    const float* cos_tab = tabp->cos.data();
    const float* sin_tab = tabp->sin.data();
    const float sgn = inverse ? -1.0f : 1.0f;
    const int64_t N = static_cast<int64_t>(B) * T;
    parallel_chunks(N, row_grain(3 * C, kGrainStream), [=](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++) {
        const int t = static_cast<int>(r % T);
        const float* cs = cos_tab + static_cast<size_t>(t) * half;
        const float* sn = sin_tab + static_cast<size_t>(t) * half;
        const float* x = src + r * 3 * C;
        float* y = dst + r * 3 * C;
        for (int hh = 0; hh < 2 * NH; hh++) {  // q heads then k heads
          const float* x1 = x + hh * HS;
          const float* x2 = x1 + half;
          float* y1 = y + hh * HS;
          float* y2 = y1 + half;
          if (accumulate) {
#pragma omp simd
            for (int i = 0; i < half; i++) {
              const float a = x1[i], b = x2[i], s = sgn * sn[i];
              y1[i] += a * cs[i] - b * s;
              y2[i] += b * cs[i] + a * s;
            }
          } else {
#pragma omp simd
            for (int i = 0; i < half; i++) {
              const float a = x1[i], b = x2[i], s = sgn * sn[i];
              y1[i] = a * cs[i] - b * s;
              y2[i] = b * cs[i] + a * s;
            }
          }
        }
        const float* xv = x + 2 * C;
        float* yv = y + 2 * C;
        if (accumulate) {
#pragma omp simd
          for (int i = 0; i < C; i++) yv[i] += xv[i];
        } else if (yv != xv) {
          std::memcpy(yv, xv, sizeof(float) * C);
        }
      }
    }, 1);
  }
};

}  // namespace
}  // namespace cpu

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

void set_num_threads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace ops
