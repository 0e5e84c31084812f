// Optimizer-side kernels of the CPU backend: AdamW against a hand-computed two-step
// reference and a double-precision reference, adamw_update_typed (16-bit parameters, masters)
// against adamw_update, and sum_squares (the gradient norm).
#include <cmath>

#include "ops/convert.h"
#include "tests/gradcheck.h"

using namespace gc;

namespace {

struct AdamW {
  double lr, b1, b2, eps, wd, gs;
};

// One AdamW step in double (Loshchilov & Hutter 2019, Algorithm 2, with Adam's bias correction).
void ref_adamw_step(DVec& p, DVec& m, DVec& v, const Vec& grad, const AdamW& h, int64_t t) {
  for (size_t i = 0; i < p.size(); i++) {
    const double g = grad[i] * h.gs;
    m[i] = h.b1 * m[i] + (1 - h.b1) * g;
    v[i] = h.b2 * v[i] + (1 - h.b2) * g * g;
    const double mhat = m[i] / (1 - std::pow(h.b1, t)), vhat = v[i] / (1 - std::pow(h.b2, t));
    p[i] -= h.lr * (mhat / (std::sqrt(vhat) + h.eps) + h.wd * p[i]);
  }
}

}  // namespace

TEST_CASE("adamw: two steps of a scalar, computed by hand") {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01, p = 1, g1 = 0.5, g2 = -0.25:
  //  t=1: m = 0.05, v = 2.5e-4, mhat = 0.5, vhat = 0.25, p = 1 - 0.1 (0.5/0.5 + 0.01) = 0.899
  //  t=2: m = 0.02, v = 3.1225e-4, mhat = 0.02/0.19, vhat = 3.1225e-4/1.999e-3,
  //       p = 0.899 - 0.1 (0.2663371 + 0.00899) = 0.8714673
  float p = 1.0f, m = 0.0f, v = 0.0f;
  const float g1 = 0.5f, g2 = -0.25f;
  be().run(ops::k::AdamwUpdate(&p, &g1, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1.0f));
  CHECK(m == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(v == doctest::Approx(2.5e-4).epsilon(1e-6));
  CHECK(p == doctest::Approx(0.899000002).epsilon(1e-6));
  be().run(ops::k::AdamwUpdate(&p, &g2, &m, &v, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 1.0f));
  CHECK(m == doctest::Approx(0.02).epsilon(1e-6));
  CHECK(v == doctest::Approx(3.1225e-4).epsilon(1e-6));
  CHECK(p == doctest::Approx(0.8714672987).epsilon(1e-6));
}

TEST_CASE("adamw: vectors against the double reference (odd and parallel sizes, grad_scale, late t)") {
  const AdamW hs[] = {{3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0}, {1e-2, 0.8, 0.99, 1e-6, 0.0, 0.125}};
  for (const AdamW& h : hs)
    for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{100003}})
      for (int64_t t0 : {int64_t{1}, int64_t{1000}}) {
        INFO("n=" << n << " t0=" << t0 << " gs=" << h.gs);
        Vec p = randn(static_cast<size_t>(n), 1), m(n, 0.0f), v(n, 0.0f);
        if (t0 > 1) {  // a warm optimizer state
          m = randn(static_cast<size_t>(n), 2, 0.01f);
          v = uniform(static_cast<size_t>(n), 3, 1e-6f, 1e-4f);
        }
        const Vec p0 = p;
        DVec rp = to_double(p), rm = to_double(m), rv = to_double(v);
        for (int64_t t = t0; t < t0 + 2; t++) {
          const Vec g = randn(static_cast<size_t>(n), 10 + t, 0.01f);
          be().run(ops::k::AdamwUpdate(p.data(), g.data(), m.data(), v.data(), n, static_cast<float>(h.lr),
                            static_cast<float>(h.b1), static_cast<float>(h.b2), static_cast<float>(h.eps),
                            static_cast<float>(h.wd), t, static_cast<float>(h.gs)));
          ref_adamw_step(rp, rm, rv, g, h, t);
        }
        // fp32 state: m, v and p each carry a few ulp (~1e-7 relative). p alone would hide a
        // wrong update (it is lr-sized, ~1e-3 of p), so compare the update p - p0 too: its
        // floor is p's rounding, 2 steps * 0.5 ulp(|p| <= 4) ~ 5e-7, over an update of >= 6e-4.
        CHECK(rel_err(m, rm) < 1e-5);
        CHECK(rel_err(v, rv) < 1e-5);
        CHECK(rel_err(p, rp) < 1e-6);
        DVec dref(n);
        Vec dgot(n);
        for (int64_t i = 0; i < n; i++) {
          dref[i] = rp[i] - p0[i];
          dgot[i] = p[i] - p0[i];
        }
        CHECK(rel_err(dgot, dref) < 2e-3);
      }
}

TEST_CASE("sum_squares: double accumulation, all sizes") {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{4097}, int64_t{1000003}}) {
    const Vec x = randn(static_cast<size_t>(n), 20 + n, 3.0f);
    double want = 0;
    for (float f : x) want += static_cast<double>(f) * f;
    const double got = ops::sum_squares(be(), x.data(), n);
    INFO("n=" << n);
    // Every product f*f is exact in double and the sum of 1e6 positive terms loses ~1e-16
    // per add: the result must match to far better than fp32 accumulation (~1e-4) would.
    CHECK(std::fabs(got - want) <= 1e-12 * want);
  }
}

// adamw_update_typed (the optimizer's whole update as one device call): over a 16-bit
// parameter it is adamw_update on the fp32 values (the masters, or the parameter widened) with
// the gradient widened, then the parameter rounded; bit for bit, whatever the piece boundaries
// (n spans several of the host default's 2^14 pieces).
TEST_CASE("adamw_update_typed: 16-bit parameters and gradients, with and without fp32 masters, bit for bit") {
  const int64_t n = 40001;
  ops::Backend::AdamwArgs a;
  a.lr = 3e-3f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f, a.t = 7, a.grad_scale = 0.5f;
  for (ops::DType pt : {ops::DType::BF16, ops::DType::F16}) {
    for (ops::DType gt : {ops::DType::F32, pt}) {
      for (bool masters : {true, false}) {
        CAPTURE(ops::dtype_name(pt));
        CAPTURE(ops::dtype_name(gt));
        CAPTURE(masters);
        Vec w(n), g(n), m(n), v(n);
        for (int64_t i = 0; i < n; ++i) {
          w[i] = 0.5f * std::sin(0.01f * i), g[i] = 0.01f * std::cos(0.37f * i);
          m[i] = 0.001f * std::sin(0.13f * i), v[i] = 1e-5f * (1.0f + std::cos(0.07f * i));
        }
        std::vector<uint16_t> w16(n), g16(n);
        ops::from_f32(w16.data(), pt, w.data(), n);
        ops::from_f32(g16.data(), gt == ops::DType::F32 ? pt : gt, g.data(), n);
        // The reference: fp32 values (the master, or the 16-bit parameter widened), fp32 gradient.
        Vec rw = w, rg = g, rm = m, rv = v;
        if (!masters) ops::to_f32(rw.data(), w16.data(), pt, n);
        if (gt != ops::DType::F32) ops::to_f32(rg.data(), g16.data(), gt, n);
        be().run(ops::k::AdamwUpdate(rw.data(), rg.data(), rm.data(), rv.data(), n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                          a.t, a.grad_scale));
        std::vector<uint16_t> want(n);
        ops::from_f32(want.data(), pt, rw.data(), n);
        Vec master = w;
        const void* grad = gt == ops::DType::F32 ? static_cast<const void*>(g.data()) : g16.data();
        be().run(ops::k::AdamwUpdateTyped(w16.data(), pt, grad, gt, masters ? master.data() : nullptr, m.data(), v.data(), n, a));
        CHECK(w16 == want);
        CHECK(m == rm);
        CHECK(v == rv);
        if (masters) CHECK(master == rw);
      }
    }
  }
}
