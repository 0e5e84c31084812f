// Measured sgemm peak (see ops/peak.h).
#include "ops/peak.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <cblas.h>

namespace ops {

double measure_cpu_gemm_peak_flops() {
  using Clock = std::chrono::steady_clock;
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  gemm();  // warm up the thread pool and the caches
  double best = 0, spent = 0;
  for (int rep = 0; rep < 400 && (rep < 5 || spent < 0.4); ++rep) {
    auto t0 = Clock::now();
    gemm();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    spent += s;
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

double measure_cpu_memory_bandwidth() {
  using Clock = std::chrono::steady_clock;
  const int64_t n = 8 << 20;  // 32 MiB per array: far beyond the caches
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n), 1.0f), c(static_cast<size_t>(n), 2.0f);
  auto triad = [&] {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 0.5f * pc[i];
  };
  triad();  // first touch and the thread pool
  double best = 0, spent = 0;
  for (int rep = 0; rep < 200 && (rep < 3 || spent < 0.2); ++rep) {
    auto t0 = Clock::now();
    triad();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    spent += s;
    best = std::max(best, 12.0 * static_cast<double>(n) / s);
  }
  return best;
}

}  // namespace ops
