// Fused operators (ops/op_fused.cpp): LinearGelu against the unfused Linear + Gelu
// pair, forward and backward, at GPT-2 124M's MLP shape (N = 1024 rows, C = 768, 4C = 3072)
// and the quickstart's small config (N = 2048, C = 192, 768), and the GPT-2 rows of
// bench/fused_runs.py's runs (N = 256: micro-batch 4 x seq 64), at the current OpenMP thread
// count. Each path runs exactly what its executor node runs: unfused, matmul + gelu forward
// and, backward, gelu_backward into a zeroed d(pre) then matmul_backward; fused, the two
// linear_gelu calls (d(pre) written over d(out)). Run as
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE build/bench_fused [--quick | --reps N]
// Each number is the best of several repetitions after one warm-up (the least noisy estimate
// on a shared machine), the two paths timed alternately; the ratio is fused / unfused.
// Then the residual add + norm (AddLayerNorm, AddRMSNorm) at GPT-2's width, fp32 and bf16.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "ops/backend.h"
#include "ops/rng.h"

namespace {

using Clock = std::chrono::steady_clock;
int g_reps = 9;

double best_time(const std::function<void()>& f) { return bench::best_time(f, g_reps); }

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) { return bench::randn(n, 0xf05e, seed, scale); }

struct Shape {
  int N, C, OC;
  const char* what;
};

// Best time of each path, the two timed alternately (one repetition of each in turn), so that
// both see the same load as it drifts.
std::pair<double, double> best_pair(const std::function<void()>& a, const std::function<void()>& b) {
  a();
  b();
  double ba = 1e30, bb = 1e30;
  for (int r = 0; r < g_reps; r++) {
    auto t0 = Clock::now();
    a();
    ba = std::min(ba, std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    b();
    bb = std::min(bb, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return {ba, bb};
}

void bench_shape(ops::Backend& be, const Shape& s) {
  const size_t nx = size_t(s.N) * s.C, nw = size_t(s.OC) * s.C, ny = size_t(s.N) * s.OC;
  const std::vector<float> x = randn(nx, 1), w = randn(nw, 2, 0.05f), b = randn(s.OC, 3, 0.1f), dout = randn(ny, 4);
  std::vector<float> pre(ny), out(ny), dpre(ny), dx(nx), dw(nw), db(s.OC);
  const auto [fu, ff] = best_pair(
      [&] {
        be.run(ops::k::MatmulForward(pre.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC));
        be.run(ops::k::GeluForward(out.data(), pre.data(), static_cast<int64_t>(ny)));
      },
      [&] { be.run(ops::k::LinearGeluForward(out.data(), pre.data(), x.data(), w.data(), b.data(), s.N, s.C, s.OC)); });
  // Unfused: the executor zeroes a fresh d(pre) buffer for the GELU's backward to accumulate
  // into, so the memset is part of its work. Fused: d(out) is consumed in place, so each
  // repetition refreshes it with a copy the executor never makes; its best time is subtracted.
  const double copy = best_time([&] { std::memcpy(dpre.data(), dout.data(), ny * sizeof(float)); });
  const auto [bu, bf_copy] = best_pair(
      [&] {
        std::memset(dpre.data(), 0, ny * sizeof(float));
        be.run(ops::k::GeluBackward(dpre.data(), pre.data(), dout.data(), static_cast<int64_t>(ny)));
        be.run(ops::k::MatmulBackward(dx.data(), dw.data(), db.data(), dpre.data(), x.data(), w.data(), s.N, s.C, s.OC));
      },
      [&] {
        std::memcpy(dpre.data(), dout.data(), ny * sizeof(float));
        be.run(ops::k::LinearGeluBackward(dx.data(), dw.data(), db.data(), dpre.data(), pre.data(), x.data(), w.data(), s.N,
                                s.C, s.OC));
      });
  const double bf = bf_copy - copy;
  std::printf("%-30s %9.3f %9.3f %7.3fx   %9.3f %9.3f %7.3fx\n", s.what, fu * 1e3, ff * 1e3, ff / fu, bu * 1e3,
              bf * 1e3, bf / bu);
}

// The residual add and the norm of its sum (AddLayerNorm / AddRMSNorm) against the
// unfused Add + norm, at GPT-2's width (N rows x C), activations in t (F32, or BF16 through the
// 16-bit-native kernels). Each path runs what its executor nodes run: unfused, add_forward then
// the norm's forward; backward, the norm's backward accumulating into d(sum) then d(sum) added
// into d(a) and d(b); fused, the two add_*norm calls. The executor's zeroing of d(a) and d(b)
// is the same for both and left out (so repetitions keep accumulating: the work is the same).
void bench_add_norm(ops::Backend& be, int N, int C, bool rms, ops::DType t, const char* what) {
  const size_t n = size_t(N) * C, es = t == ops::DType::F32 ? 4 : 2;
  auto stored = [&](const std::vector<float>& v) {
    std::vector<char> b(v.size() * es);
    be.run(ops::k::Convert(b.data(), t, v.data(), ops::DType::F32, static_cast<int64_t>(v.size())));
    return b;
  };
  std::vector<char> a = stored(randn(n, 11)), b = stored(randn(n, 12)), dy = stored(randn(n, 13)),
                    ds = stored(randn(n, 14)), da = stored(std::vector<float>(n, 0.0f)), db = da, sum = da, y = da;
  const std::vector<float> w = randn(C, 15, 0.1f), bias = randn(C, 16, 0.1f);
  std::vector<float> mean(N), rstd(N), dw(C), dbias(C);
  const bool f32 = t == ops::DType::F32;
  const auto [fu, ff] = best_pair(
      [&] {
        if (f32) be.run(ops::k::AddForward(reinterpret_cast<float*>(sum.data()), reinterpret_cast<const float*>(a.data()),
                                reinterpret_cast<const float*>(b.data()), static_cast<int64_t>(n)));
        else be.run(ops::k::AddForward(sum.data(), a.data(), b.data(), static_cast<int64_t>(n)), t);
        if (rms && f32) be.run(ops::k::RmsNormForward(reinterpret_cast<float*>(y.data()), rstd.data(),
                                           reinterpret_cast<const float*>(sum.data()), w.data(), N, C, 1e-5f));
        else if (rms) be.run(ops::k::RmsNormForward(y.data(), rstd.data(), sum.data(), w.data(), N, C, 1e-5f), t);
        else if (f32) be.run(ops::k::LayerNormForward(reinterpret_cast<float*>(y.data()), mean.data(), rstd.data(),
                                           reinterpret_cast<const float*>(sum.data()), w.data(), bias.data(), N, C, 1e-5f));
        else be.run(ops::k::LayerNormForward(y.data(), mean.data(), rstd.data(), sum.data(), w.data(), bias.data(), N, C, 1e-5f), t);
      },
      [&] {
        if (rms) be.run(ops::k::AddRmsNormForward(sum.data(), y.data(), rstd.data(), a.data(), b.data(), w.data(), N, C, 1e-5f), t);
        else be.run(ops::k::AddLayerNormForward(sum.data(), y.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                      bias.data(), N, C, 1e-5f), t);
      });
  const auto [bu, bf] = best_pair(
      [&] {
        if (rms && f32) be.run(ops::k::RmsNormBackward(reinterpret_cast<float*>(ds.data()), dw.data(),
                                            reinterpret_cast<const float*>(dy.data()),
                                            reinterpret_cast<const float*>(sum.data()), w.data(), rstd.data(), N, C));
        else if (rms) be.run(ops::k::RmsNormBackward(ds.data(), dw.data(), dy.data(), sum.data(), w.data(), rstd.data(), N, C), t);
        else if (f32) be.run(ops::k::LayerNormBackward(reinterpret_cast<float*>(ds.data()), dw.data(), dbias.data(),
                                            reinterpret_cast<const float*>(dy.data()),
                                            reinterpret_cast<const float*>(sum.data()), w.data(), mean.data(),
                                            rstd.data(), N, C));
        else be.run(ops::k::LayerNormBackward(ds.data(), dw.data(), dbias.data(), dy.data(), sum.data(), w.data(), mean.data(),
                                     rstd.data(), N, C), t);
        for (std::vector<char>* d : {&da, &db}) {
          if (f32) be.run(ops::k::AddInplace(reinterpret_cast<float*>(d->data()), reinterpret_cast<const float*>(ds.data()),
                                  static_cast<int64_t>(n)));
          else be.run(ops::k::AddInplace(d->data(), ds.data(), static_cast<int64_t>(n)), t);
        }
      },
      [&] {
        if (rms) be.run(ops::k::AddRmsNormBackward(da.data(), db.data(), dw.data(), ds.data(), dy.data(), sum.data(), w.data(),
                                         rstd.data(), N, C), t);
        else be.run(ops::k::AddLayerNormBackward(da.data(), db.data(), dw.data(), dbias.data(), ds.data(), dy.data(),
                                       sum.data(), w.data(), mean.data(), rstd.data(), N, C), t);
      });
  std::printf("%-30s %9.3f %9.3f %7.3fx   %9.3f %9.3f %7.3fx\n", what, fu * 1e3, ff * 1e3, ff / fu, bu * 1e3,
              bf * 1e3, bf / bu);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--quick") == 0) g_reps = 3;
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) g_reps = std::max(1, std::atoi(argv[++i]));
  }
  ops::Backend& be = ops::cpu_backend();
  std::printf("linear + gelu, fused (linear_gelu) vs unfused, ms (best of %d), %d threads\n", g_reps,
              ops::num_threads());
  std::printf("%-30s %9s %9s %8s   %9s %9s %8s\n", "shape (N x C -> OC)", "fwd", "fwd fused", "ratio", "bwd",
              "bwd fused", "ratio");
  for (const Shape& s : {Shape{1024, 768, 3072, "gpt2-124M mlp 1024x768->3072"},
                         Shape{256, 768, 3072, "gpt2 fused_runs 256x768->3072"},
                         Shape{2048, 192, 768, "small 2048x192->768"}})
    bench_shape(be, s);
  std::printf("\nresidual add + norm, fused (add_layernorm / add_rmsnorm) vs unfused, ms (best of %d), %d threads\n",
              g_reps, ops::num_threads());
  std::printf("%-30s %9s %9s %8s   %9s %9s %8s\n", "shape (N x C), activations", "fwd", "fwd fused", "ratio", "bwd",
              "bwd fused", "ratio");
  bench_add_norm(be, 1024, 768, false, ops::DType::F32, "layernorm 1024x768 fp32");
  bench_add_norm(be, 1024, 768, false, ops::DType::BF16, "layernorm 1024x768 bf16");
  bench_add_norm(be, 1024, 768, true, ops::DType::F32, "rmsnorm 1024x768 fp32");
  bench_add_norm(be, 1024, 768, true, ops::DType::BF16, "rmsnorm 1024x768 bf16");
  return 0;
}
