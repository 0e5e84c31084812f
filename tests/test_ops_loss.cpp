// Fused softmax cross-entropy of the CPU backend against a double reference, driven by a
// table of cases (gradcheck.h): padding columns (Vreal < V), ignored rows (negative
// targets), extreme logits, GPT-2's 50257-token vocabulary, and aliasing of
// logits/probs/dlogits.
#include <cmath>

#include "tests/gradcheck.h"

using namespace gc;

namespace {

// losses[r] = logsumexp(x[r, :Vreal]) - x[r, target[r]], or 0 when target[r] < 0.
DVec ref_xent(const DVec& logits, const std::vector<int32_t>& tgt, int N, int V, int Vreal) {
  DVec loss(N, 0.0);
  for (int r = 0; r < N; r++) {
    if (tgt[r] < 0) continue;
    const double* x = &logits[static_cast<size_t>(r) * V];
    double mx = -1e300, s = 0;
    for (int i = 0; i < Vreal; i++) mx = std::max(mx, x[i]);
    for (int i = 0; i < Vreal; i++) s += std::exp(x[i] - mx);
    loss[r] = std::log(s) + mx - x[tgt[r]];
  }
  return loss;
}

struct XentShape {
  int N, V, Vreal;
  float logit_scale = 1.0f;
  int ignore_every = 0;  // every k-th row gets target -1
  size_t max_coords = 300;
};
const XentShape kXent[] = {
    {1, 1, 1},          {3, 10, 10},         {4, 17, 13},          {5, 64, 50, 1.0f, 2},
    {6, 40, 33, 30.0f}, // logits spanning +-100: the max-subtraction must keep exp finite
    {2, 50257, 50257, 1.0f, 0, 120},
    {8, 50304, 50257, 2.0f, 3, 60},  // GPT-2 vocabulary padded to a multiple of 128; parallel rows
};

OpCase xent_case(const XentShape& s) {
  const int N = s.N, V = s.V, Vreal = s.Vreal;
  const float dloss = 1.0f / 3.0f;  // e.g. 1 / (number of counted rows)
  std::vector<int32_t> tgt = randint(N, static_cast<uint64_t>(V) + N, Vreal);
  if (s.ignore_every)
    for (int r = 0; r < N; r += s.ignore_every) tgt[r] = -1;
  OpCase c;
  c.name = "softmax_xent N=" + std::to_string(N) + " V=" + std::to_string(V) + " Vreal=" + std::to_string(Vreal) +
           (s.ignore_every ? " with ignored rows" : "");
  Vec logits = randn(static_cast<size_t>(N) * V, 700 + V, s.logit_scale);
  for (int r = 0; r < N; r++)  // padding columns hold garbage that must be ignored
    for (int i = Vreal; i < V; i++) logits[static_cast<size_t>(r) * V + i] = 1e4f;
  c.inputs = {{"logits", logits}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_xent(a[0], tgt, N, V, Vreal); };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec losses(N, 5.0f), probs(a[0].size());
    be().run(ops::k::SoftmaxXentForward(losses.data(), probs.data(), a[0].data(), tgt.data(), N, V, Vreal));
    return losses;
  };
  // L = dloss * sum(losses): the backward takes one scalar dloss for every row.
  c.make_dout = [=](size_t n) { return Vec(n, dloss); };
  c.backward = [=](const std::vector<Vec>& a, const Vec&, const std::vector<float*>& g) {
    if (!g[0]) return;
    Vec losses(N), probs(a[0].size());
    be().run(ops::k::SoftmaxXentForward(losses.data(), probs.data(), a[0].data(), tgt.data(), N, V, Vreal));
    be().run(ops::k::SoftmaxXentBackward(g[0], probs.data(), tgt.data(), dloss, N, V, Vreal));
  };
  c.accumulates = false;  // the one backward that overwrites (ops/backend.h)
  c.max_coords = s.max_coords;
  return c;
}

}  // namespace

TEST_CASE("softmax_xent: forward and backward against double reference") {
  for (const XentShape& s : kXent) run_case(xent_case(s));
}

TEST_CASE("softmax_xent: probs, padding columns, ignored rows, overwrite and aliasing") {
  const int N = 9, V = 300, Vreal = 257;
  const float dloss = 0.25f;
  std::vector<int32_t> tgt = randint(N, 3, Vreal);
  tgt[2] = -1;
  tgt[7] = -100;  // any negative target is ignored (PyTorch's default ignore_index is -100)
  tgt[4] = Vreal - 1;
  const Vec logits = randn(static_cast<size_t>(N) * V, 4, 3.0f);

  Vec losses(N), probs(logits.size(), 7.0f);
  be().run(ops::k::SoftmaxXentForward(losses.data(), probs.data(), logits.data(), tgt.data(), N, V, Vreal));
  for (int r = 0; r < N; r++) {
    const float* x = &logits[static_cast<size_t>(r) * V];
    const float* p = &probs[static_cast<size_t>(r) * V];
    double mx = -1e300, s = 0, psum = 0;
    for (int i = 0; i < Vreal; i++) mx = std::max(mx, static_cast<double>(x[i]));
    for (int i = 0; i < Vreal; i++) s += std::exp(x[i] - mx);
    for (int i = 0; i < Vreal; i++) {
      REQUIRE(std::fabs(p[i] - std::exp(x[i] - mx) / s) <= 1e-6 * (std::exp(x[i] - mx) / s) + 1e-12);
      psum += p[i];
    }
    CHECK(psum == doctest::Approx(1.0).epsilon(1e-5));
    for (int i = Vreal; i < V; i++) REQUIRE(p[i] == 0.0f);  // padding probabilities are 0
    if (tgt[r] < 0) CHECK(losses[r] == 0.0f);
  }

  // Backward overwrites whatever was in dlogits.
  Vec d(logits.size(), 123.0f);
  be().run(ops::k::SoftmaxXentBackward(d.data(), probs.data(), tgt.data(), dloss, N, V, Vreal));
  for (int r = 0; r < N; r++)
    for (int i = 0; i < V; i++) {
      const size_t k = static_cast<size_t>(r) * V + i;
      float want = 0.0f;
      if (tgt[r] >= 0 && i < Vreal) want = (probs[k] - (i == tgt[r] ? 1.0f : 0.0f)) * dloss;
      REQUIRE(d[k] == doctest::Approx(want).epsilon(1e-6).scale(1e-9));
    }

  // In place, as the training loop runs it: probs alias logits, dlogits alias probs.
  Vec buf = logits, losses2(N);
  be().run(ops::k::SoftmaxXentForward(losses2.data(), buf.data(), buf.data(), tgt.data(), N, V, Vreal));
  CHECK(buf == probs);
  CHECK(losses2 == losses);
  be().run(ops::k::SoftmaxXentBackward(buf.data(), buf.data(), tgt.data(), dloss, N, V, Vreal));
  CHECK(buf == d);
}
