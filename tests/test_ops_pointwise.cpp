// Pointwise operators (GELU, squared ReLU, SwiGLU, add, dropout, scale) and the vectorized exp of
// ops/cpu/vecmath.h, against double references, driven by tables of cases (gradcheck.h).
#include <cmath>
#include <limits>

#include "ops/cpu/vecmath.h"
#include "tests/gradcheck.h"

using namespace gc;

namespace {

// Sizes: tiny, odd, not a multiple of the 16-lane vector, and large enough to be split
// across threads (the kernels go parallel above 2 * 4096 or 2 * 16384 elements).
const int64_t kSizes[] = {1, 7, 33, 1000, 40001};

// Inputs spanning the interesting range of the nonlinearities, plus their far tails.
Vec wide_inputs(int64_t n, uint64_t seed) {
  Vec x = randn(static_cast<size_t>(n), seed, 3.0f);
  const float tails[] = {-30.0f, -12.0f, -6.0f, 6.0f, 12.0f, 30.0f, 0.0f};
  for (size_t i = 0; i < std::size(tails) && i < x.size(); i++) x[x.size() - 1 - i] = tails[i];
  return x;
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch GELU(approximate="tanh").
double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

OpCase gelu_case(int64_t n) {
  OpCase c;
  c.name = "gelu n=" + std::to_string(n);
  c.inputs = {{"inp", wide_inputs(n, 100 + n)}};
  c.ref_forward = [](const std::vector<DVec>& a) {
    DVec out(a[0].size());
    for (size_t i = 0; i < out.size(); i++) out[i] = ref_gelu(a[0][i]);
    return out;
  };
  c.forward = [](const std::vector<Vec>& a) {
    Vec out(a[0].size());
    be().run(ops::k::GeluForward(out.data(), a[0].data(), static_cast<int64_t>(a[0].size())));
    return out;
  };
  c.backward = [](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::GeluBackward(g[0], a[0].data(), dout.data(), static_cast<int64_t>(a[0].size())));
  };
  return c;
}

// relu(x)^2 (Primer's squared ReLU, Hugging Face's "relu2").
double ref_relu2(double x) { return x > 0.0 ? x * x : 0.0; }

OpCase relu2_case(int64_t n) {
  OpCase c;
  c.name = "relu2 n=" + std::to_string(n);
  c.inputs = {{"inp", wide_inputs(n, 300 + n)}};
  c.ref_forward = [](const std::vector<DVec>& a) {
    DVec out(a[0].size());
    for (size_t i = 0; i < out.size(); i++) out[i] = ref_relu2(a[0][i]);
    return out;
  };
  c.forward = [](const std::vector<Vec>& a) {
    Vec out(a[0].size());
    be().run(ops::k::Relu2Forward(out.data(), a[0].data(), static_cast<int64_t>(a[0].size())));
    return out;
  };
  c.backward = [](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::Relu2Backward(g[0], a[0].data(), dout.data(), static_cast<int64_t>(a[0].size())));
  };
  return c;
}

OpCase swiglu_case(int N, int H) {
  OpCase c;
  c.name = "swiglu N=" + std::to_string(N) + " H=" + std::to_string(H);
  c.inputs = {{"inp", wide_inputs(static_cast<int64_t>(N) * 2 * H, 200 + N * H)}};
  c.ref_forward = [=](const std::vector<DVec>& a) {
    DVec out(static_cast<size_t>(N) * H);
    for (int r = 0; r < N; r++)
      for (int i = 0; i < H; i++) {
        const double g = a[0][static_cast<size_t>(r) * 2 * H + i], u = a[0][static_cast<size_t>(r) * 2 * H + H + i];
        out[static_cast<size_t>(r) * H + i] = g / (1.0 + std::exp(-g)) * u;
      }
    return out;
  };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out(static_cast<size_t>(N) * H);
    be().run(ops::k::SwigluForward(out.data(), a[0].data(), N, H));
    return out;
  };
  c.backward = [=](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::SwigluBackward(g[0], dout.data(), a[0].data(), N, H));
  };
  return c;
}

OpCase add_case(int64_t n) {
  OpCase c;
  c.name = "add n=" + std::to_string(n);
  c.inputs = {{"a", randn(static_cast<size_t>(n), 300 + n)}, {"b", randn(static_cast<size_t>(n), 301 + n)}};
  c.ref_forward = [](const std::vector<DVec>& a) {
    DVec out(a[0].size());
    for (size_t i = 0; i < out.size(); i++) out[i] = a[0][i] + a[1][i];
    return out;
  };
  c.forward = [](const std::vector<Vec>& a) {
    Vec out(a[0].size());
    be().run(ops::k::AddForward(out.data(), a[0].data(), a[1].data(), static_cast<int64_t>(out.size())));
    return out;
  };
  // The backward of add is two add_inplace calls (ops/backend.h); add_inplace(null) skips.
  c.backward = [](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::AddInplace(g[0], dout.data(), static_cast<int64_t>(dout.size())));
    be().run(ops::k::AddInplace(g[1], dout.data(), static_cast<int64_t>(dout.size())));
  };
  return c;
}

double keep_scale(uint64_t key, uint64_t i, float p) {
  return ops::rng_uniform(key, i) >= p ? 1.0 / (1.0 - static_cast<double>(p)) : 0.0;
}

OpCase dropout_case(int64_t n, float p, uint64_t offset = 0) {
  const ops::DropoutSpec drop{p, ops::rng_key(99, 1, 2, static_cast<uint64_t>(n)), offset};
  OpCase c;
  c.name = "dropout n=" + std::to_string(n) + " p=" + std::to_string(p) + " offset=" + std::to_string(offset);
  c.inputs = {{"inp", randn(static_cast<size_t>(n), 400 + n)}};
  c.ref_forward = [=](const std::vector<DVec>& a) {
    DVec out(a[0].size());
    for (size_t i = 0; i < out.size(); i++) out[i] = a[0][i] * keep_scale(drop.key, drop.offset + i, drop.p);
    return out;
  };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out(a[0].size());
    be().run(ops::k::DropoutForward(out.data(), a[0].data(), static_cast<int64_t>(out.size()), drop));
    return out;
  };
  // The backward regenerates the mask from the key: FD through the double reference (which
  // uses the forward's mask) only agrees if the regenerated mask is the same.
  c.backward = [=](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::DropoutBackward(g[0], dout.data(), static_cast<int64_t>(dout.size()), drop));
  };
  return c;
}

}  // namespace

TEST_CASE("gelu: forward and backward against double reference") {
  for (int64_t n : kSizes) run_case(gelu_case(n));
}

TEST_CASE("relu2: forward and backward against double reference") {
  for (int64_t n : kSizes) run_case(relu2_case(n));
}

TEST_CASE("relu2: the backward accumulates, zero and negative inputs, NaN propagates") {
  const float x[] = {-2.0f, -0.0f, 0.0f, 0.5f, 3.0f, std::numeric_limits<float>::quiet_NaN()};
  const float dy[] = {1.0f, 1.0f, 1.0f, 2.0f, -1.0f, 1.0f};
  float y[6], d[6] = {10.0f, 10.0f, 10.0f, 10.0f, 10.0f, 10.0f};
  be().run(ops::k::Relu2Forward(y, x, 6));
  be().run(ops::k::Relu2Backward(d, x, dy, 6));
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == 0.0f);
  CHECK(y[2] == 0.0f);
  CHECK(y[3] == 0.25f);
  CHECK(y[4] == 9.0f);
  CHECK(std::isnan(y[5]));  // an overflow stays visible to the loss scaler
  CHECK(d[0] == 10.0f);     // += 0
  CHECK(d[2] == 10.0f);
  CHECK(d[3] == 12.0f);     // += 2 * (2 * 0.5)
  CHECK(d[4] == 4.0f);      // += -1 * (2 * 3)
  CHECK(std::isnan(d[5]));
}

TEST_CASE("swiglu: forward and backward against double reference") {
  const int shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {16, 1536}, {2, 100}};
  for (auto& s : shapes) run_case(swiglu_case(s[0], s[1]));
}

TEST_CASE("add: forward, add_inplace backward, and aliasing") {
  for (int64_t n : kSizes) run_case(add_case(n));
  // out may alias a or b
  const int64_t n = 40001;
  Vec a = randn(n, 1), b = randn(n, 2), a0 = a;
  be().run(ops::k::AddForward(a.data(), a.data(), b.data(), n));
  for (int64_t i = 0; i < n; i++) REQUIRE(a[i] == a0[i] + b[i]);
  be().run(ops::k::AddForward(b.data(), a0.data(), b.data(), n));
  CHECK(b == a);
}

TEST_CASE("dropout: forward and backward against double reference") {
  for (int64_t n : kSizes)
    for (float p : {0.0f, 0.1f, 0.5f}) run_case(dropout_case(n, p));
  run_case(dropout_case(999, 0.2f, 123456789));
}

TEST_CASE("dropout: the offset places a slice inside a larger buffer (layout independence)") {
  // Dropping a whole buffer at once equals dropping two slices, the second at offset n1.
  const int64_t n = 50000, n1 = 20001;
  const ops::DropoutSpec whole{0.25f, 4321, 7};
  const Vec x = randn(n, 30);
  Vec all(n), parts(n);
  be().run(ops::k::DropoutForward(all.data(), x.data(), n, whole));
  be().run(ops::k::DropoutForward(parts.data(), x.data(), n1, whole));
  be().run(ops::k::DropoutForward(parts.data() + n1, x.data() + n1, n - n1, {whole.p, whole.key, whole.offset + n1}));
  CHECK(all == parts);
  Vec gall(n, 0.0f), gparts(n, 0.0f);
  be().run(ops::k::DropoutBackward(gall.data(), x.data(), n, whole));
  be().run(ops::k::DropoutBackward(gparts.data(), x.data(), n1, whole));
  be().run(ops::k::DropoutBackward(gparts.data() + n1, x.data() + n1, n - n1, {whole.p, whole.key, whole.offset + n1}));
  CHECK(gall == gparts);
}

TEST_CASE("dropout: determinism, keep fraction, p = 0") {
  const int64_t n = 200000;
  const Vec x = uniform(n, 5, 1.0f, 2.0f);  // nonzero, so out == 0 means dropped
  const float p = 0.3f;
  Vec a(n), b(n), c(n);
  be().run(ops::k::DropoutForward(a.data(), x.data(), n, {p, 1234}));
  be().run(ops::k::DropoutForward(b.data(), x.data(), n, {p, 1234}));
  be().run(ops::k::DropoutForward(c.data(), x.data(), n, {p, 1235}));
  CHECK(a == b);  // same key: bit-identical
  CHECK(a != c);  // another key: another mask
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    if (a[i] != 0.0f) {
      kept++;
      REQUIRE(a[i] == doctest::Approx(x[i] / (1.0f - p)).epsilon(1e-6));
    }
  }
  // Binomial(n, 0.7): std of the kept fraction is sqrt(0.21 / n) ~ 1e-3; allow 5 sigma.
  CHECK(std::fabs(static_cast<double>(kept) / n - (1.0 - p)) < 5e-3);
  // p = 0 is the identity (out-of-place and in-place), for any key.
  Vec d(n), e = x;
  be().run(ops::k::DropoutForward(d.data(), x.data(), n, {0.0f, 77}));
  be().run(ops::k::DropoutForward(e.data(), e.data(), n, {0.0f, 77}));
  CHECK(d == x);
  CHECK(e == x);
  // backward with p = 0 adds dout through.
  Vec g(n, 1.0f);
  be().run(ops::k::DropoutBackward(g.data(), x.data(), n, {0.0f, 77}));
  for (int64_t i = 0; i < n; i++) REQUIRE(g[i] == 1.0f + x[i]);
  // backward zeroes exactly the dropped positions of the forward.
  Vec gb(n, 0.0f);
  be().run(ops::k::DropoutBackward(gb.data(), x.data(), n, {p, 1234}));
  for (int64_t i = 0; i < n; i++) REQUIRE((gb[i] == 0.0f) == (a[i] == 0.0f));
}

TEST_CASE("scale") {
  for (int64_t n : kSizes) {
    Vec x = randn(static_cast<size_t>(n), 6), y = x;
    be().run(ops::k::Scale(y.data(), n, -0.37f));
    for (int64_t i = 0; i < n; i++) REQUIRE(y[i] == x[i] * -0.37f);
  }
}

TEST_CASE("vecmath: exp_f accuracy over the whole fp32 range") {
  // Relative error vs double exp on a dense sweep up to the overflow threshold; the Cephes
  // polynomial is good to ~1-2 ulp (2^-23 = 1.2e-7).
  double worst = 0;
  for (double x = -87.3; x <= 88.72; x += 1e-3) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::fabs(ops::cpu::exp_f(xf) - want) / want);
  }
  INFO("worst relative error " << worst);
  CHECK(worst < 2e-7);
  CHECK(ops::cpu::exp_f(0.0f) == 1.0f);
  CHECK(ops::cpu::exp_f(-100.0f) == 0.0f);
  CHECK(ops::cpu::exp_f(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isfinite(ops::cpu::exp_f(88.72f)));
  CHECK(ops::cpu::exp_f(100.0f) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(ops::cpu::exp_f(std::numeric_limits<float>::quiet_NaN())));
  // exp16 (16 lanes, vector extensions) is exp_f lane for lane, bit for bit.
  for (double x0 = -100.0; x0 <= 100.0; x0 += 16 * 0.0123) {
    float xs[16];
    for (int l = 0; l < 16; l++) xs[l] = static_cast<float>(x0 + 0.0123 * l);
    const ops::cpu::vf16 y = ops::cpu::exp16(ops::cpu::load16(xs));
    for (int l = 0; l < 16; l++) REQUIRE(y[l] == ops::cpu::exp_f(xs[l]));
  }
  // gelu far tails: exactly 0 / x, no NaN from inf/inf.
  CHECK(ops::cpu::gelu_f(-100.0f) == 0.0f);
  CHECK(ops::cpu::gelu_f(100.0f) == 100.0f);
  CHECK(ops::cpu::gelu_grad_f(-100.0f) == 0.0f);
  CHECK(ops::cpu::gelu_grad_f(100.0f) == 1.0f);
}
