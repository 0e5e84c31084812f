// What the C++ benchmarks share: a best-of-N timer and deterministic normal test data.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/rng.h"

namespace bench {

// Best wall time of f() in seconds over `reps` runs, after one warm-up run.
inline double best_time(const std::function<void()>& f, int reps) {
  using Clock = std::chrono::steady_clock;
  f();
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// n values drawn from N(0, scale^2) by the counter-based RNG (stream `stream`, seed `seed`).
inline std::vector<float> randn(size_t n, uint64_t stream, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  const uint64_t key = ops::rng_key(stream, seed);
  for (size_t i = 0; i < n; i++) v[i] = scale * ops::rng_normal(key, i);
  return v;
}

}  // namespace bench
