// The whole model against PyTorch: logits, loss, every gradient and a 5-step AdamW
// trajectory from the float64 fixtures written by scripts/make_fixtures.py.
//
// Tolerance: our model runs in fp32, so per-tensor relative error ||ours - ref|| / ||ref||
// is bounded by accumulated fp32 rounding (~1e-7 per op, a few hundred ops deep): 1e-4 is
// the bar we hold the model to and leaves two orders of magnitude of margin (measured ~1e-6). Tensors
// whose reference is analytically zero (the key slice of qkv.bias) are compared against
// an absolute floor instead (see docs/fixtures.md).
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/executor.h"
#include "runner/model/gpt.h"
#include "runner/train/optimizer.h"

#include "tests/support/device.h"
using namespace runner;

namespace {

struct H5 {
  hid_t f;
  explicit H5(const std::string& path) { f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  ~H5() { H5Fclose(f); }
  std::vector<double> f64(const std::string& name) {
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    REQUIRE_MESSAGE(d >= 0, "fixture dataset missing: " << name);
    hid_t s = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(s);
    std::vector<double> v(static_cast<size_t>(n));
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(s);
    H5Dclose(d);
    return v;
  }
  std::vector<int32_t> i32(const std::string& name) {
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    hid_t s = H5Dget_space(d);
    std::vector<int32_t> v(static_cast<size_t>(H5Sget_simple_extent_npoints(s)));
    H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(s);
    H5Dclose(d);
    return v;
  }
  bool exists(const std::string& name) { return H5Lexists(f, name.c_str(), H5P_DEFAULT) > 0; }
  int64_t attr_int(const std::string& name) {
    hid_t g = H5Gopen2(f, "/config", H5P_DEFAULT);
    hid_t a = H5Aopen(g, name.c_str(), H5P_DEFAULT);
    int64_t v = 0;
    H5Aread(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Gclose(g);
    return v;
  }
  std::string attr_str(const std::string& name) {
    hid_t g = H5Gopen2(f, "/config", H5P_DEFAULT);
    hid_t a = H5Aopen(g, name.c_str(), H5P_DEFAULT);
    hid_t t = H5Aget_type(a);
    size_t n = H5Tget_size(t);
    std::string v(n, '\0');
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, n);
    H5Aread(a, mt, v.data());
    H5Tclose(mt);
    H5Tclose(t);
    H5Aclose(a);
    H5Gclose(g);
    return v.c_str();
  }
};

double rel_err(const float* a, const std::vector<double>& b, double floor = 1e-6) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), floor);
}

struct Golden {
  H5 h5;
  ModelConfig m;
  int64_t B, T;
  ops::Graph g;
  ParamSet ps;
  std::unique_ptr<ops::Executor> ex;
  std::vector<int32_t> tokens, targets;

  explicit Golden(const std::string& file) : h5(std::string(RUNNER_TEST_DIR) + "/fixtures/" + file) {
    REQUIRE(h5.f >= 0);
    m.vocab_size = h5.attr_int("vocab_size");
    m.seq_len = h5.attr_int("seq_len");
    m.d_model = h5.attr_int("d_model");
    m.n_layers = h5.attr_int("n_layers");
    m.n_heads = h5.attr_int("n_heads");
    m.mlp_ratio = static_cast<double>(h5.attr_int("mlp_hidden")) / static_cast<double>(m.d_model);
    m.norm = parse_enum<Norm>(h5.attr_str("norm")).value();
    m.activation = parse_enum<Activation>(h5.attr_str("activation")).value();
    m.position = parse_enum<Position>(h5.attr_str("position")).value();
    m.tie_embeddings = h5.attr_int("tie_embeddings") != 0;
    m.bias = h5.attr_int("bias") != 0;
    REQUIRE(m.mlp_hidden() == h5.attr_int("mlp_hidden"));
    B = h5.attr_int("batch_size");
    T = m.seq_len;
    GptSpec spec;
    spec.model = m;
    spec.B = B;
    g = build_gpt_graph(spec);
    ops::Backend& be = test_support::test_device();  // before any tensor (strict: device memory)
    ps = init_params(g, m, 1);
    for (size_t i = 0; i < ps.names.size(); ++i) {
      auto ref = h5.f64("/params/" + ps.names[i]);
      REQUIRE_MESSAGE(static_cast<int64_t>(ref.size()) == ps.values[i].numel(), ps.names[i]);
      test_support::set_values(ps.values[i], std::vector<float>(ref.begin(), ref.end()));
    }
    ex = std::make_unique<ops::Executor>(g, be);
    bind_params(*ex, g, ps);
    tokens = h5.i32("/inputs/tokens");
    targets = h5.i32("/inputs/targets");
  }

  double loss_and_grads() {
    zero_grads(ps);
    auto ls = ex->forward(tokens.data(), targets.data(), true);
    ex->backward(1.0f / static_cast<float>(ls.count));
    return ls.sum / static_cast<double>(ls.count);
  }
};

void check_fixture(const std::string& file) {
  Golden G(file);
  // Parameter names: exactly the fixture's set.
  for (auto& n : G.ps.names) CHECK_MESSAGE(G.h5.exists("/params/" + n), n);

  // Logits.
  const ops::Tensor& logits = G.ex->forward_logits(G.tokens.data());
  auto ref_logits = G.h5.f64("/outputs/logits");
  REQUIRE(static_cast<int64_t>(ref_logits.size()) == logits.numel());
  CHECK(rel_err(test_support::host_values(logits).data(), ref_logits) < 1e-4);

  // Loss and every gradient.
  double loss = G.loss_and_grads();
  double ref_loss = G.h5.f64("/outputs/loss")[0];
  CHECK(std::fabs(loss - ref_loss) / ref_loss < 1e-4);
  for (size_t i = 0; i < G.ps.names.size(); ++i) {
    auto ref = G.h5.f64("/grads/" + G.ps.names[i]);
    double e = rel_err(test_support::host_values(G.ps.grads[i]).data(), ref, 1e-3);
    CHECK_MESSAGE(e < 1e-4, G.ps.names[i] << " gradient relative error " << e);
  }

  // Five AdamW steps (decay on all parameters, constant lr, clip 1.0) on the same batch.
  OptimizerConfig o;
  o.lr = 1e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  o.grad_clip = 1.0;
  TrainState st;
  st.params = std::move(G.ps);
  for (size_t i = 0; i < st.params.decay.size(); ++i) st.params.decay[i] = true;
  auto& ops_be = test_support::test_device();
  G.ex = std::make_unique<ops::Executor>(G.g, ops_be);
  bind_params(*G.ex, G.g, st.params);
  auto ref_losses = G.h5.f64("/trajectory/losses");
  auto ref_norms = G.h5.f64("/trajectory/grad_norms");
  for (int s = 0; s < 5; ++s) {
    zero_grads(st.params);
    auto ls = G.ex->forward(G.tokens.data(), G.targets.data(), true);
    G.ex->backward(1.0f / static_cast<float>(ls.count));
    double l = ls.sum / static_cast<double>(ls.count);
    CHECK(std::fabs(l - ref_losses[s]) / ref_losses[s] < 1e-4);
    double norm = grad_norm(ops_be, st.params);
    CHECK(std::fabs(norm - ref_norms[s]) / ref_norms[s] < 1e-4);
    adamw_step(ops_be, o, st, o.lr, clip_factor(norm, o.grad_clip));
    st.step++;
  }
  for (size_t i = 0; i < st.params.names.size(); ++i) {
    const std::string& name = st.params.names[i];
    auto ref = G.h5.f64("/trajectory/params/" + name);
    const std::vector<float> values = test_support::host_values(st.params.values[i]);
    const float* ours = values.data();
    if (name.size() > 13 && name.compare(name.size() - 13, 13, "attn.qkv.bias") == 0) {
      // The key slice has an analytically zero gradient: fp32 round-off (~1e-9) there is
      // amplified by Adam's normalisation into moves of up to ~0.1 lr per step, so that
      // slice gets an absolute bound (5 steps x 1e-4); q and v keep the relative bound.
      size_t C = ref.size() / 3;
      for (size_t part : {size_t{0}, size_t{2}}) {
        std::vector<double> r(ref.begin() + part * C, ref.begin() + (part + 1) * C);
        double e = rel_err(ours + part * C, r);
        CHECK_MESSAGE(e < 1e-4, name << " slice " << part << " after 5 steps, relative error " << e);
      }
      double worst = 0;
      for (size_t k = C; k < 2 * C; ++k) worst = std::max(worst, std::fabs(ours[k] - ref[k]));
      CHECK_MESSAGE(worst < 5e-4, name << " key slice after 5 steps, absolute error " << worst);
      continue;
    }
    double e = rel_err(ours, ref);
    CHECK_MESSAGE(e < 1e-4, name << " after 5 steps, relative error " << e);
  }
}

}  // namespace

TEST_CASE("gpt_tiny (layernorm, gelu, learned positions, tied) matches PyTorch") { check_fixture("gpt_tiny.h5"); }

TEST_CASE("llama_tiny (rmsnorm, swiglu, rope, untied, no bias) matches PyTorch") { check_fixture("llama_tiny.h5"); }
