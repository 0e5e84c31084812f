// Operator test harness shared by tests/test_ops_*.cpp (in the spirit of ggml's
// test-backend-ops): each operator family is a table of cases; a case names its inputs,
// gives a simple DOUBLE-precision reference forward, and wraps the fp32 kernel's forward
// and backward. run_case() then checks, for every case:
//   1. forward: fp32 kernel vs the double reference (normwise relative error < fwd_tol);
//   2. backward: with L = sum(out * R) for a random R, every input gradient of the fp32
//      kernel vs central finite differences of L computed on the double reference;
//   3. the accumulate convention: pre-filled gradient buffers are added to, and calling
//      backward twice doubles the gradients;
//   4. null gradient pointers: each gradient in turn is passed as null; nothing crashes and
//      the remaining gradients are unchanged.
//
// Error metric: normwise relative error max_i |got_i - want_i| / max_i |want_i|. An fp32
// kernel's error on an element is ~eps32 * (size of the terms that formed it), and those
// terms are on the scale of the tensor, not of the element (an output that is a small
// difference of large terms cannot be more accurate than the terms); so the tensor's scale
// is the fair denominator, and element-wise relative error would fail on near-zero entries
// of perfectly good kernels.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/rng.h"

namespace gc {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

inline ops::Backend& be() { return ops::cpu_backend(); }

// ---- random data (counter RNG: reproducible, independent of call order) ----
inline Vec randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Vec v(n);
  const uint64_t key = ops::rng_key(0x7e57, seed);
  for (size_t i = 0; i < n; i++) v[i] = scale * ops::rng_normal(key, i);
  return v;
}
inline Vec uniform(size_t n, uint64_t seed, float lo, float hi) {
  Vec v(n);
  const uint64_t key = ops::rng_key(0x7e58, seed);
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * ops::rng_uniform(key, i);
  return v;
}
inline std::vector<int32_t> randint(size_t n, uint64_t seed, int32_t hi) {
  std::vector<int32_t> v(n);
  const uint64_t key = ops::rng_key(0x7e59, seed);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<int32_t>(ops::rng_u32(key, i) % static_cast<uint32_t>(hi));
  return v;
}
inline DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }
inline double dot(const DVec& a, const DVec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// ---- error metrics ----
inline double max_abs(const DVec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
// Normwise relative error (see the file comment). 0 when both are all-zero.
inline double rel_err(const float* got, const double* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  if (den == 0) return num;
  return num / den;
}
inline double rel_err(const Vec& got, const DVec& want) {
  REQUIRE(got.size() == want.size());
  return rel_err(got.data(), want.data(), got.size());
}
inline double rel_err(const Vec& got, const Vec& want) { return rel_err(got, to_double(want)); }

// ---- finite differences ----
// Central differences dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h in double, at the given
// coordinates. With h = 1e-5 (relative to |x_i|, at least 1e-5) the truncation error is
// O(h^2 |L'''|) ~ 1e-10 and the rounding error O(eps64 |L| / h) ~ 1e-11 |L|: both far below
// the 1e-4 tolerance on the fp32 kernels, so the FD gradient is effectively exact.
inline DVec fd_grad(DVec x, const std::vector<size_t>& coords, const std::function<double(const DVec&)>& loss) {
  DVec g(coords.size());
  for (size_t k = 0; k < coords.size(); k++) {
    const size_t i = coords[k];
    const double x0 = x[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[k] = (lp - lm) / (2 * h);
  }
  return g;
}
// All coordinates when n <= max_coords, else a reproducible random subset of max_coords.
inline std::vector<size_t> pick_coords(size_t n, size_t max_coords, uint64_t seed) {
  std::vector<size_t> c;
  if (n <= max_coords) {
    for (size_t i = 0; i < n; i++) c.push_back(i);
  } else {
    ops::SplitMix rng{ops::rng_key(0xfd, seed), 0};
    for (size_t k = 0; k < max_coords; k++) c.push_back(rng.below(n));
  }
  return c;
}

// ---- the case harness ----
struct Input {
  std::string name;
  Vec data;
  bool differentiable = true;
};

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  // Double reference forward: all inputs (as double) -> the differentiated output, flattened.
  std::function<DVec(const std::vector<DVec>&)> ref_forward;
  // fp32 kernel forward: inputs -> output (same layout as ref_forward's).
  std::function<Vec(const std::vector<Vec>&)> forward;
  // fp32 kernel backward: given inputs and dout, add into grads[j] (null where not wanted or
  // for non-differentiable inputs). Runs its own forward when it needs saved tensors.
  std::function<void(const std::vector<Vec>&, const Vec& dout, const std::vector<float*>& grads)> backward;
  // dout for the backward (default: random normal). L = sum(out * dout).
  std::function<Vec(size_t)> make_dout;
  double fwd_tol = 1e-5;
  double bwd_tol = 1e-4;
  size_t max_coords = 300;  // finite-difference coordinates checked per input
  bool accumulates = true;  // false for the loss (softmax_xent_backward and xent_shard_backward
                            // overwrite dlogits by contract, ops/backend.h)
};

// GRADCHECK_VERBOSE=1 prints every measured error (to see the margins under the tolerances).
inline bool verbose() {
  static const bool v = std::getenv("GRADCHECK_VERBOSE") != nullptr;
  return v;
}

inline void run_case(const OpCase& c) {
  INFO("case: " << c.name);
  const size_t ni = c.inputs.size();
  std::vector<Vec> in(ni);
  std::vector<DVec> din(ni);
  for (size_t j = 0; j < ni; j++) {
    in[j] = c.inputs[j].data;
    din[j] = to_double(in[j]);
  }

  // 1. forward
  const Vec out = c.forward(in);
  const DVec ref = c.ref_forward(din);
  REQUIRE(out.size() == ref.size());
  const double fe = rel_err(out, ref);
  INFO("forward rel err " << fe);
  if (verbose()) std::printf("%-50s forward            %.2e\n", c.name.c_str(), fe);
  CHECK(fe < c.fwd_tol);
  if (!c.backward) return;

  // 2. backward vs finite differences of L = sum(ref_forward(x) * dout)
  const Vec dout = c.make_dout ? c.make_dout(out.size()) : randn(out.size(), 4242);
  const DVec ddout = to_double(dout);
  auto run_backward = [&](std::vector<Vec>& grads, int skip) {
    std::vector<float*> ptrs(ni, nullptr);
    for (size_t j = 0; j < ni; j++)
      if (c.inputs[j].differentiable && static_cast<int>(j) != skip) ptrs[j] = grads[j].data();
    c.backward(in, dout, ptrs);
  };
  std::vector<Vec> g(ni);
  for (size_t j = 0; j < ni; j++) g[j].assign(in[j].size(), 0.0f);
  run_backward(g, -1);
  for (size_t j = 0; j < ni; j++) {
    if (!c.inputs[j].differentiable) continue;
    INFO("gradient of input '" << c.inputs[j].name << "'");
    const auto coords = pick_coords(in[j].size(), c.max_coords, j + 1);
    const DVec fd = fd_grad(din[j], coords, [&](const DVec& x) {
      std::vector<DVec> args = din;
      args[j] = x;
      return dot(c.ref_forward(args), ddout);
    });
    Vec got(coords.size());
    for (size_t k = 0; k < coords.size(); k++) got[k] = g[j][coords[k]];
    const double be = rel_err(got, fd);
    INFO("backward rel err " << be << " (max |grad| " << max_abs(fd) << ")");
    if (verbose()) std::printf("%-50s d%-17s %.2e\n", c.name.c_str(), c.inputs[j].name.c_str(), be);
    CHECK(be < c.bwd_tol);
  }
  if (!c.accumulates) return;

  // 3. accumulate: pre-filled buffers are added to; a second call doubles from zero.
  // (Not bit-exact: a beta=1 GEMM may add its K-blocks into C one at a time.)
  {
    std::vector<Vec> g0(ni), g1(ni), g2(ni);
    for (size_t j = 0; j < ni; j++) {
      g0[j] = randn(in[j].size(), 777 + j);
      g1[j] = g0[j];
      g2[j].assign(in[j].size(), 0.0f);
    }
    run_backward(g1, -1);
    run_backward(g2, -1);
    run_backward(g2, -1);
    for (size_t j = 0; j < ni; j++) {
      if (!c.inputs[j].differentiable) continue;
      INFO("accumulate into input '" << c.inputs[j].name << "'");
      DVec want1(in[j].size()), want2(in[j].size());
      for (size_t i = 0; i < want1.size(); i++) {
        want1[i] = static_cast<double>(g0[j][i]) + g[j][i];
        want2[i] = 2.0 * g[j][i];
      }
      CHECK(rel_err(g1[j], want1) < 1e-5);
      CHECK(rel_err(g2[j], want2) < 1e-5);
    }
  }

  // 4. null gradient pointers: skip one gradient at a time.
  for (size_t skip = 0; skip < ni; skip++) {
    if (!c.inputs[skip].differentiable) continue;
    INFO("null gradient for input '" << c.inputs[skip].name << "'");
    std::vector<Vec> gs(ni);
    for (size_t j = 0; j < ni; j++) gs[j].assign(in[j].size(), 0.0f);
    run_backward(gs, static_cast<int>(skip));
    for (size_t j = 0; j < ni; j++) {
      if (!c.inputs[j].differentiable || j == skip) continue;
      CHECK(rel_err(gs[j], g[j]) < 1e-6);
    }
  }
}

}  // namespace gc
