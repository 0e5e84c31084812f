// Measured sgemm peak (see ops/peak.h).
#include "ops/peak.h"

#include <algorithm>
#include <chrono>
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

}  // namespace ops
