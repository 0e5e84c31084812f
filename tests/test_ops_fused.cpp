// Fused operators (ops/op_fused.cpp): LinearGelu, the MLP's fc Linear and its GELU
// in one node; and, in the second half, AddLayerNorm / AddRMSNorm, the block's first residual
// add and its second norm in one node. What fusing must not change, checked bit for bit (the fused kernels run the
// unfused pair's operations in the same order, so equality is exact, not a tolerance):
//   1. the kernels against the unfused pair (matmul + gelu), forward and backward;
//   2. the backward at 1, 2 and 3 threads (the bias gradient is a reduction over rows);
//   3. a few training steps of a model built with model.fuse on and off: the same losses and
//      weights; recompute of the fused node; the dry run's peaks against the measured ones;
// and, against the double-precision reference, a gradient check of the fused backward.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/ops.h"
#include "runner/model/gpt.h"
#include "tests/gradcheck.h"
#include "tests/support/device.h"
#include "tests/support/models.h"
#include "tests/support/train_steps.h"

using gc::Vec;
using runner::ModelConfig;

namespace {

using test_support::same_bits;

// One fc + GELU problem: x (N,C), W (OC,C), b (OC), d(out) (N,OC), and gradients that start
// non-zero (backwards accumulate).
struct Problem {
  int N, C, OC;
  bool bias;
  Vec x, w, b, dout, dx0, dw0, db0;
  Problem(int N_, int C_, int OC_, bool bias_) : N(N_), C(C_), OC(OC_), bias(bias_) {
    x = gc::randn(size_t(N) * C, 1);
    w = gc::randn(size_t(OC) * C, 2, 0.2f);
    b = gc::randn(size_t(OC), 3, 0.5f);
    dout = gc::randn(size_t(N) * OC, 4);
    dout[5] = -0.0f;  // a signed zero: the unfused path turns its product into +0
    dx0 = gc::randn(x.size(), 5, 0.1f);
    dw0 = gc::randn(w.size(), 6, 0.1f);
    db0 = gc::randn(b.size(), 7, 0.1f);
  }
  const float* bp() const { return bias ? b.data() : nullptr; }
};

// Everything both paths produce: out, pre, d(pre), dx, dW, db.
struct Result {
  Vec out, pre, dpre, dx, dw, db;
};

Result unfused(const Problem& p) {
  ops::Backend& be = gc::be();
  Result r{Vec(p.dout.size()), Vec(p.dout.size()), Vec(p.dout.size(), 0.0f), p.dx0, p.dw0, p.db0};
  be.run(ops::k::MatmulForward(r.pre.data(), p.x.data(), p.w.data(), p.bp(), p.N, p.C, p.OC));
  be.run(ops::k::GeluForward(r.out.data(), r.pre.data(), static_cast<int64_t>(r.pre.size())));
  be.run(ops::k::GeluBackward(r.dpre.data(), r.pre.data(), p.dout.data(), static_cast<int64_t>(r.pre.size())));
  be.run(ops::k::MatmulBackward(r.dx.data(), r.dw.data(), p.bias ? r.db.data() : nullptr, r.dpre.data(), p.x.data(), p.w.data(),
                     p.N, p.C, p.OC));
  return r;
}

Result fused(const Problem& p) {
  ops::Backend& be = gc::be();
  Result r{Vec(p.dout.size()), Vec(p.dout.size()), p.dout, p.dx0, p.dw0, p.db0};
  be.run(ops::k::LinearGeluForward(r.out.data(), r.pre.data(), p.x.data(), p.w.data(), p.bp(), p.N, p.C, p.OC));
  be.run(ops::k::LinearGeluBackward(r.dx.data(), r.dw.data(), p.bias ? r.db.data() : nullptr, r.dpre.data(), r.pre.data(),
                          p.x.data(), p.w.data(), p.N, p.C, p.OC));
  return r;
}

void check_same(const Result& a, const Result& b) {
  CHECK(same_bits(a.out, b.out));
  CHECK(same_bits(a.pre, b.pre));
  CHECK(same_bits(a.dpre, b.dpre));
  CHECK(same_bits(a.dx, b.dx));
  CHECK(same_bits(a.dw, b.dw));
  CHECK(same_bits(a.db, b.db));
}

double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}

}  // namespace

TEST_CASE("linear_gelu kernels equal the unfused matmul + gelu bit for bit") {
  // Odd shapes (vector remainders, K not a multiple of 64) and a GPT-like one (parallel paths).
  for (auto [N, C, OC] : {std::tuple{7, 5, 13}, std::tuple{67, 45, 77}, std::tuple{256, 128, 512}})
    for (bool bias : {true, false}) {
      CAPTURE(N);
      CAPTURE(OC);
      CAPTURE(bias);
      const Problem p(N, C, OC, bias);
      check_same(unfused(p), fused(p));
    }
}

TEST_CASE("linear_gelu backward does not depend on the thread count (1, 2, 3 threads)") {
  const Problem p(1024, 96, 768, true);  // columns split 2 and 3 ways, rows long enough to go parallel
  const int before = ops::num_threads();
  ops::set_num_threads(1);
  const Result ref = fused(p);
  for (int t : {2, 3}) {
    CAPTURE(t);
    ops::set_num_threads(t);
    check_same(ref, fused(p));
  }
  ops::set_num_threads(before);
}

TEST_CASE("linear_gelu gradient check against the double reference") {
  const int N = 6, C = 7, OC = 9;
  gc::OpCase c;
  c.name = "linear_gelu";
  c.inputs = {{"x", gc::randn(size_t(N) * C, 11)}, {"W", gc::randn(size_t(OC) * C, 12, 0.5f)},
              {"b", gc::randn(size_t(OC), 13, 0.5f)}};
  c.ref_forward = [=](const std::vector<gc::DVec>& in) {
    gc::DVec out(size_t(N) * OC);
    for (int r = 0; r < N; r++)
      for (int o = 0; o < OC; o++) {
        double s = in[2][o];
        for (int k = 0; k < C; k++) s += in[0][size_t(r) * C + k] * in[1][size_t(o) * C + k];
        out[size_t(r) * OC + o] = gelu_ref(s);
      }
    return out;
  };
  c.forward = [=](const std::vector<Vec>& in) {
    Vec out(size_t(N) * OC), pre(out.size());
    gc::be().run(ops::k::LinearGeluForward(out.data(), pre.data(), in[0].data(), in[1].data(), in[2].data(), N, C, OC));
    return out;
  };
  c.backward = [=](const std::vector<Vec>& in, const Vec& dout, const std::vector<float*>& g) {
    Vec out(size_t(N) * OC), pre(out.size()), dpre = dout;
    gc::be().run(ops::k::LinearGeluForward(out.data(), pre.data(), in[0].data(), in[1].data(), in[2].data(), N, C, OC));
    gc::be().run(ops::k::LinearGeluBackward(g[0], g[1], g[2], dpre.data(), pre.data(), in[0].data(), in[1].data(), N, C, OC));
  };
  gc::run_case(c);
}

namespace {

ModelConfig small_gpt(bool fuse) {
  ModelConfig m = test_support::small_model(97, 32, 64, 4, 2);
  m.dropout = 0.1;
  m.fuse = fuse;
  return m;
}

int count_kind(const ops::Graph& g, ops::OpKind k) {
  int n = 0;
  for (const ops::Node& node : g.nodes) n += node.kind == k;
  return n;
}

// A model's graph, parameters and executor, with Adam moments for a few steps of AdamW.
struct Model {
  ops::Graph g;
  runner::ParamSet ps;
  std::vector<ops::Tensor> m, v;
  std::unique_ptr<ops::Executor> ex;
  Model(const ModelConfig& cfg, int64_t B, bool recompute_mlp) {
    ops::Backend& be = test_support::test_device();
    runner::GptSpec spec;
    spec.model = cfg;
    spec.B = B;
    runner::RecomputeConfig rc;
    if (recompute_mlp) { rc.mode = runner::RecomputeMode::selective; rc.modules = {ops::Module::mlp}; }
    spec.recompute = runner::recompute_sets(rc, cfg.n_layers);
    g = runner::build_gpt_graph(spec);
    ps = runner::init_params(g, cfg, 7);
    for (const ops::Tensor& p : ps.values) {
      m.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
      v.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
    }
    ex = std::make_unique<ops::Executor>(g, be);
    runner::bind_params(*ex, g, ps);
  }
  // One step: forward, backward, AdamW; returns the loss sum.
  double step(const test_support::TokenBatch& b, int64_t t) {
    ops::Backend& be = test_support::test_device();
    for (ops::Tensor& gr : ps.grads) be.mem_zero(gr.raw(), gr.nbytes());
    auto l = ex->forward(b.tok.data(), b.tgt.data(), true, 40 + static_cast<uint64_t>(t), 0);
    ex->backward(1.0f / static_cast<float>(l.count));
    for (size_t i = 0; i < ps.values.size(); ++i)
      be.run(ops::k::AdamwUpdate(ps.values[i].data<float>(), ps.grads[i].data<float>(), m[i].data<float>(), v[i].data<float>(),
                      ps.values[i].numel(), 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 1.0f));
    return l.sum;
  }
};

// The graph the builder makes of m in dtype act under tp ranks, with or without sequence parallelism.
ops::Graph graph_of(const ModelConfig& m, ops::DType act, int64_t tp, bool sp) {
  runner::GptSpec s;
  s.model = m;
  s.act_dtype = act;
  s.tp = tp;
  s.sequence_parallel = sp;
  return runner::build_gpt_graph(s);
}

}  // namespace

TEST_CASE("model.fuse: the builder fuses fc + gelu only where the graph allows it") {
  test_support::test_device();
  auto kinds = graph_of;
  const ModelConfig on = small_gpt(true), off = small_gpt(false);
  CHECK(count_kind(kinds(on, ops::DType::F32, 1, false), ops::OpKind::LinearGelu) == 2);
  CHECK(count_kind(kinds(on, ops::DType::F32, 1, false), ops::OpKind::Gelu) == 0);
  CHECK(count_kind(kinds(on, ops::DType::F32, 2, false), ops::OpKind::LinearGelu) == 2);  // column-parallel
  CHECK(count_kind(kinds(off, ops::DType::F32, 1, false), ops::OpKind::LinearGelu) == 0);
  CHECK(count_kind(kinds(on, ops::DType::BF16, 1, false), ops::OpKind::LinearGelu) == 0);
  CHECK(count_kind(kinds(on, ops::DType::F32, 2, true), ops::OpKind::LinearGelu) == 0);
  ModelConfig llama = on;
  test_support::make_llama(llama);
  CHECK(count_kind(kinds(llama, ops::DType::F32, 1, false), ops::OpKind::LinearGelu) == 0);
}

TEST_CASE("training with model.fuse on and off: the same losses and weights, bit for bit (recompute too)") {
  const int64_t B = 2;
  const auto batch = test_support::random_tokens(B * 32, 97);
  Model off(small_gpt(false), B, false), on(small_gpt(true), B, false), on_rc(small_gpt(true), B, true);
  REQUIRE(count_kind(on.g, ops::OpKind::LinearGelu) == 2);
  int recomputed = 0;
  for (const ops::Node& n : on_rc.g.nodes) recomputed += n.kind == ops::OpKind::LinearGelu && n.recompute;
  CHECK(recomputed == 2);
  for (int64_t t = 1; t <= 3; ++t) {
    CAPTURE(t);
    const double l_off = off.step(batch, t), l_on = on.step(batch, t), l_rc = on_rc.step(batch, t);
    CHECK(l_on == l_off);
    CHECK(l_rc == l_off);
  }
  for (size_t i = 0; i < off.ps.values.size(); ++i) {
    CAPTURE(off.ps.names[i]);
    CHECK(test_support::host_bytes(on.ps.values[i]) == test_support::host_bytes(off.ps.values[i]));
    CHECK(test_support::host_bytes(on_rc.ps.values[i]) == test_support::host_bytes(off.ps.values[i]));
  }
}

TEST_CASE("the dry run predicts the fused model's measured peaks, and the fused backward holds less") {
  const int64_t B = 3;
  const auto batch = test_support::random_tokens(B * 32, 97);
  size_t ws_peak[2] = {0, 0};
  for (bool fuse : {false, true})
    for (bool rc : {false, true}) {
      CAPTURE(fuse);
      CAPTURE(rc);
      Model r(small_gpt(fuse), B, rc);
      const ops::MemoryEstimate est = ops::Executor::simulate(r.g);
      auto& mt = ops::MemoryTracker::instance();
      const size_t act0 = mt.current(ops::Account::Activations), ws0 = mt.current(ops::Account::Workspace);
      mt.reset_peaks();
      auto l = r.ex->forward(batch.tok.data(), batch.tgt.data(), true, 1, 0);
      r.ex->backward(1.0f / static_cast<float>(l.count));
      CHECK(mt.peak(ops::Account::Activations) - act0 == est.peak[static_cast<int>(ops::Account::Activations)]);
      CHECK(mt.peak(ops::Account::Workspace) - ws0 == est.peak[static_cast<int>(ops::Account::Workspace)]);
      if (!rc) ws_peak[fuse] = est.peak[static_cast<int>(ops::Account::Workspace)];
    }
  CHECK(ws_peak[1] <= ws_peak[0]);
}

TEST_CASE("linear_gelu refuses 16-bit tensors (the builder keeps 16-bit fc + gelu unfused)") {
  ops::Backend& be = test_support::test_device();  // before any tensor (strict: device memory)
  ops::Graph g;
  g.B = 1;
  g.T = 4;
  g.stage_input = g.add_activation("x", {4, 3}, 0, ops::DType::BF16);
  const int w = g.add_param("W", {5, 3}, 0);
  ops::Node n;
  n.kind = ops::OpKind::LinearGelu;
  n.name = "fc_gelu";
  n.in = {g.stage_input, w};
  n.out = {g.add_activation("y", {4, 5}, 0, ops::DType::BF16), g.add_activation("pre", {4, 5}, 0, ops::DType::BF16)};
  g.add_node(n);
  g.stage_output = n.out[0];
  g.finalize();
  ops::Tensor wv = ops::Tensor::zeros({5, 3}, ops::DType::F32, ops::Account::Parameters);
  ops::Tensor wg = ops::Tensor::zeros({5, 3}, ops::DType::F32, ops::Account::Gradients);
  ops::Executor ex(g, be);
  ex.bind_param(w, &wv, &wg);
  std::vector<uint16_t> in(12, 0), out(20, 0);
  CHECK_THROWS_AS(ex.forward(nullptr, nullptr, true, 1, 0, in.data(), out.data()), std::logic_error);
}

// ---------------------------------------------------------------------------------------------
// AddLayerNorm, AddRMSNorm: the block's first residual add and its second norm in
// one node. The same promises, bit for bit: the kernels against the unfused Add + norm calls
// (fp32, and bf16 and fp16 on the 16-bit-native path, where the sum is rounded before the
// norm reads it), at 1, 2 and 3 threads; and training with model.fuse on and off (GPT-style
// LayerNorm and Llama-style RMSNorm models, fp32 and bf16), with and without recompute of the
// norm and residual modules, the dry run equal to the measured peaks in each.

namespace {

using ops::DType;

// An activation buffer of n values stored in t (fp32 values rounded to t when 16-bit).
struct Act {
  DType t;
  std::vector<uint16_t> h;
  Vec f;
  Act(DType t_, const Vec& v) : t(t_) {
    if (t == DType::F32) {
      f = v;
    } else {
      h.resize(v.size());
      ops::cpu_backend().run(ops::k::Convert(h.data(), t, v.data(), DType::F32, static_cast<int64_t>(v.size())));
    }
  }
  void* p() { return t == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  bool operator==(const Act& o) const {
    return t == o.t && (t == DType::F32 ? same_bits(f, o.f) : h == o.h);
  }
};

// One add + norm problem: a, b (N,C), weight and bias (C), d(y) and d(sum from downstream)
// (N,C), and gradients that start non-zero (backwards accumulate), with signed zeros where
// the unfused path's `0 +` matters.
struct NormProblem {
  int N, C;
  bool rms, bias;
  DType t;
  Vec a, b, w, bi, dy, ds, da0, db0, dw0, dbi0;
  NormProblem(int N_, int C_, bool rms_, bool bias_, DType t_) : N(N_), C(C_), rms(rms_), bias(bias_), t(t_) {
    const size_t n = size_t(N) * C;
    a = gc::randn(n, 21);
    b = gc::randn(n, 22, 0.5f);
    w = gc::randn(size_t(C), 23, 0.3f);
    for (float& x : w) x += 1.0f;
    bi = gc::randn(size_t(C), 24, 0.2f);
    dy = gc::randn(n, 25);
    ds = gc::randn(n, 26);
    ds[3] = -0.0f;
    dy[3] = 0.0f;
    da0 = gc::randn(n, 27, 0.1f);
    da0[3] = -0.0f;
    db0 = gc::randn(n, 28, 0.1f);
    dw0 = gc::randn(size_t(C), 29, 0.1f);
    dbi0 = gc::randn(size_t(C), 30, 0.1f);
  }
};

// Everything both paths produce.
struct NormResult {
  Act sum, y, dsum, da, db;
  Vec mean, rstd, dw, dbi;
};

NormResult norm_run(const NormProblem& p, bool fused) {
  ops::Backend& be = ops::cpu_backend();
  const int64_t n = int64_t(p.N) * p.C;
  Act a(p.t, p.a), b(p.t, p.b), dy(p.t, p.dy);
  NormResult r{Act(p.t, Vec(size_t(n), 0.0f)), Act(p.t, Vec(size_t(n), 0.0f)), Act(p.t, p.ds), Act(p.t, p.da0),
               Act(p.t, p.db0), Vec(size_t(p.N)), Vec(size_t(p.N)), p.dw0, p.dbi0};
  const float* bias = p.bias ? p.bi.data() : nullptr;
  float* dbias = p.bias ? r.dbi.data() : nullptr;
  const float eps = 1e-5f;
  if (fused) {
    if (p.rms) {
      be.run(ops::k::AddRmsNormForward(r.sum.p(), r.y.p(), r.rstd.data(), a.p(), b.p(), p.w.data(), p.N, p.C, eps), p.t);
      be.run(ops::k::AddRmsNormBackward(r.da.p(), r.db.p(), r.dw.data(), r.dsum.p(), dy.p(), r.sum.p(), p.w.data(),
                              r.rstd.data(), p.N, p.C), p.t);
    } else {
      be.run(ops::k::AddLayerNormForward(r.sum.p(), r.y.p(), r.mean.data(), r.rstd.data(), a.p(), b.p(), p.w.data(), bias,
                               p.N, p.C, eps), p.t);
      be.run(ops::k::AddLayerNormBackward(r.da.p(), r.db.p(), r.dw.data(), dbias, r.dsum.p(), dy.p(), r.sum.p(), p.w.data(),
                                r.mean.data(), r.rstd.data(), p.N, p.C), p.t);
    }
    return r;
  }
  // Unfused: what the executor runs for the Add node and the norm node (fp32 kernels, or the
  // 16-bit-native ones), in the backward's order: the norm accumulates into d(sum), then the
  // Add adds d(sum) into d(a) and d(b).
  if (p.t == DType::F32) {
    be.run(ops::k::AddForward(r.sum.f.data(), a.f.data(), b.f.data(), n));
    if (p.rms) {
      be.run(ops::k::RmsNormForward(r.y.f.data(), r.rstd.data(), r.sum.f.data(), p.w.data(), p.N, p.C, eps));
      be.run(ops::k::RmsNormBackward(r.dsum.f.data(), r.dw.data(), dy.f.data(), r.sum.f.data(), p.w.data(), r.rstd.data(), p.N,
                          p.C));
    } else {
      be.run(ops::k::LayerNormForward(r.y.f.data(), r.mean.data(), r.rstd.data(), r.sum.f.data(), p.w.data(), bias, p.N, p.C,
                           eps));
      be.run(ops::k::LayerNormBackward(r.dsum.f.data(), r.dw.data(), dbias, dy.f.data(), r.sum.f.data(), p.w.data(),
                            r.mean.data(), r.rstd.data(), p.N, p.C));
    }
    be.run(ops::k::AddInplace(r.da.f.data(), r.dsum.f.data(), n));
    be.run(ops::k::AddInplace(r.db.f.data(), r.dsum.f.data(), n));
    return r;
  }
  be.run(ops::k::AddForward(r.sum.p(), a.p(), b.p(), n), p.t);
  if (p.rms) {
    be.run(ops::k::RmsNormForward(r.y.p(), r.rstd.data(), r.sum.p(), p.w.data(), p.N, p.C, eps), p.t);
    be.run(ops::k::RmsNormBackward(r.dsum.p(), r.dw.data(), dy.p(), r.sum.p(), p.w.data(), r.rstd.data(), p.N, p.C), p.t);
  } else {
    be.run(ops::k::LayerNormForward(r.y.p(), r.mean.data(), r.rstd.data(), r.sum.p(), p.w.data(), bias, p.N, p.C, eps), p.t);
    be.run(ops::k::LayerNormBackward(r.dsum.p(), r.dw.data(), dbias, dy.p(), r.sum.p(), p.w.data(), r.mean.data(),
                            r.rstd.data(), p.N, p.C), p.t);
  }
  be.run(ops::k::AddInplace(r.da.p(), r.dsum.p(), n), p.t);
  be.run(ops::k::AddInplace(r.db.p(), r.dsum.p(), n), p.t);
  return r;
}

void check_same(const NormResult& u, const NormResult& f, bool rms) {
  CHECK(f.sum == u.sum);
  CHECK(f.y == u.y);
  if (!rms) CHECK(same_bits(f.mean, u.mean));
  CHECK(same_bits(f.rstd, u.rstd));
  CHECK(f.dsum == u.dsum);
  CHECK(f.da == u.da);
  CHECK(f.db == u.db);
  CHECK(same_bits(f.dw, u.dw));
  CHECK(same_bits(f.dbi, u.dbi));
}

struct ThreadScope {
  int saved = ops::num_threads();
  explicit ThreadScope(int n) { ops::set_num_threads(n); }
  ~ThreadScope() { ops::set_num_threads(saved); }
};

}  // namespace

TEST_CASE("add + norm kernels equal the unfused add + norm bit for bit (fp32, bf16, fp16; 1, 2, 3 threads)") {
  // Shapes: odd widths, one row, and enough rows for several of the norms' reduction blocks
  // (64 rows at C = 773), a GPT-2 width.
  const int shapes[][2] = {{1, 5}, {7, 37}, {150, 773}, {130, 768}};
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (bool rms : {false, true})
      for (bool bias : {false, true}) {
        if (rms && bias) continue;
        for (const auto& s : shapes) {
          CAPTURE(ops::dtype_name(t));
          CAPTURE(rms);
          CAPTURE(bias);
          CAPTURE(s[0]);
          CAPTURE(s[1]);
          const NormProblem p(s[0], s[1], rms, bias, t);
          NormResult ref = [&] { ThreadScope one(1); return norm_run(p, false); }();
          for (int threads : {1, 2, 3}) {
            CAPTURE(threads);
            ThreadScope ts(threads);
            check_same(ref, norm_run(p, true), rms);
            check_same(ref, norm_run(p, false), rms);  // the unfused pair is thread-count independent too
          }
        }
      }
}

TEST_CASE("the Backend's composed add + norm default is the unfused pair (what other backends run)") {
  // The defaults live on Backend itself (ops/cuda/ runs them): called non-virtually on the CPU
  // backend, they compose its unfused kernels.
  ops::Backend& be = ops::cpu_backend();
  for (DType t : {DType::F32, DType::BF16})
    for (bool rms : {false, true}) {
      CAPTURE(ops::dtype_name(t));
      CAPTURE(rms);
      const NormProblem p(70, 45, rms, !rms, t);
      const NormResult u = norm_run(p, false);
      NormResult f = norm_run(p, false);  // shapes and starting values
      Act a(t, p.a), b(t, p.b), dy(t, p.dy);
      f.dsum = Act(t, p.ds), f.da = Act(t, p.da0), f.db = Act(t, p.db0), f.dw = p.dw0, f.dbi = p.dbi0;
      if (rms) {
        ops::add_rmsnorm_forward_composed(
            be, ops::k::AddRmsNormForward(f.sum.p(), f.y.p(), f.rstd.data(), a.p(), b.p(), p.w.data(), p.N, p.C, 1e-5f), t);
        ops::add_rmsnorm_backward_composed(be, ops::k::AddRmsNormBackward(f.da.p(), f.db.p(), f.dw.data(), f.dsum.p(), dy.p(),
                                                                          f.sum.p(), p.w.data(), f.rstd.data(), p.N, p.C), t);
      } else {
        ops::add_layernorm_forward_composed(be, ops::k::AddLayerNormForward(f.sum.p(), f.y.p(), f.mean.data(), f.rstd.data(), a.p(), b.p(),
                                                                            p.w.data(), p.bi.data(), p.N, p.C, 1e-5f), t);
        ops::add_layernorm_backward_composed(be, ops::k::AddLayerNormBackward(f.da.p(), f.db.p(), f.dw.data(), f.dbi.data(), f.dsum.p(), dy.p(),
                                                                              f.sum.p(), p.w.data(), f.mean.data(), f.rstd.data(), p.N, p.C), t);
      }
      check_same(u, f, rms);
    }
}

namespace {

struct TrainRun : test_support::TrainSteps {
  int fused = 0, fused_recomputed = 0;
};

// `steps` AdamW steps of a small model (tests/support/train_steps.h; dropout on), model.fuse on
// or off, activations in `act`, recompute per `rc`; the dry run checked at every step.
TrainRun train_addnorm(runner::ModelConfig m, DType act, bool fuse, const runner::RecomputeConfig& rc, int steps) {
  m.fuse = fuse;
  runner::GptSpec spec;
  spec.model = m;
  spec.B = 3;
  spec.act_dtype = act;
  spec.recompute = runner::recompute_sets(rc, m.n_layers);
  TrainRun r;
  for (const ops::Node& n : runner::build_gpt_graph(spec).nodes)
    if (n.kind == ops::OpKind::AddLayerNorm || n.kind == ops::OpKind::AddRMSNorm) {
      r.fused++;
      r.fused_recomputed += n.recompute;
    }
  static_cast<test_support::TrainSteps&>(r) = test_support::train_steps(spec, steps);
  CHECK(r.dry_run_exact);
  return r;
}

runner::RecomputeConfig recompute_of(std::vector<ops::Module> mods, bool full = false) {
  runner::RecomputeConfig rc;
  if (full) rc.mode = runner::RecomputeMode::full;
  else if (!mods.empty()) { rc.mode = runner::RecomputeMode::selective; rc.modules = mods; }
  return rc;
}

}  // namespace

TEST_CASE("training with model.fuse on and off: add + norm fused, the same losses, weights and dry run") {
  struct Policy {
    const char* name;
    runner::RecomputeConfig rc;
    bool fuses;  // whether the layer's policy lets the pair fuse
    bool recomputed;
  };
  const Policy policies[] = {
      {"none", recompute_of({}), true, false},
      {"norm + residual", recompute_of({ops::Module::norm, ops::Module::residual}), true, true},
      {"norm alone (kept unfused)", recompute_of({ops::Module::norm}), false, false},
      {"mlp", recompute_of({ops::Module::mlp}), true, false},
      {"full", recompute_of({}, true), true, true},
  };
  for (bool llama : {false, true})
    for (DType act : {DType::F32, DType::BF16}) {
      runner::ModelConfig m = test_support::small_model(61, 13, 40, 4, 2);  // C = 40: no multiple of 16
      if (llama) test_support::make_llama(m);
      m.dropout = 0.1;
      for (const Policy& pol : policies) {
        CAPTURE(llama);
        CAPTURE(ops::dtype_name(act));
        CAPTURE(pol.name);
        const TrainRun off = train_addnorm(m, act, false, pol.rc, 3), on = train_addnorm(m, act, true, pol.rc, 3);
        CHECK(off.fused == 0);
        CHECK(on.fused == (pol.fuses ? 2 : 0));
        CHECK(on.fused_recomputed == (pol.fuses && pol.recomputed ? 2 : 0));
        test_support::check_same_bits(on, off, true);
      }
    }
}

TEST_CASE("model.fuse: the builder fuses add + norm only where the graph allows it") {
  test_support::test_device();
  auto count = [](const ModelConfig& m, ops::DType act, int64_t tp, bool sp) {
    const ops::Graph g = graph_of(m, act, tp, sp);
    return count_kind(g, ops::OpKind::AddLayerNorm) + count_kind(g, ops::OpKind::AddRMSNorm);
  };
  const ModelConfig on = small_gpt(true), off = small_gpt(false);
  CHECK(count(on, ops::DType::F32, 1, false) == 2);
  CHECK(count(on, ops::DType::BF16, 1, false) == 2);
  CHECK(count(off, ops::DType::F32, 1, false) == 0);
  CHECK(count(on, ops::DType::F32, 2, false) == 0);
  CHECK(count(on, ops::DType::F32, 2, true) == 0);
  ops::set_native16(false);  // the widened 16-bit path would norm an unrounded sum
  CHECK(count(on, ops::DType::BF16, 1, false) == 0);
  CHECK(count(on, ops::DType::F32, 1, false) == 2);
  ops::set_native16(true);
  ModelConfig llama = on;
  test_support::make_llama(llama);
  runner::GptSpec s;
  s.model = llama;
  const ops::Graph g = runner::build_gpt_graph(s);
  CHECK(count_kind(g, ops::OpKind::AddRMSNorm) == 2);
  CHECK(count_kind(g, ops::OpKind::RMSNorm) == 2 + 1);  // each layer's ln1, and ln_f
  // The fused graph keeps the unfused tensors' names and ids.
  const ops::Graph u = [&] { runner::GptSpec su = s; su.model.fuse = false; return runner::build_gpt_graph(su); }();
  REQUIRE(u.tensors.size() == g.tensors.size());
  for (size_t i = 0; i < g.tensors.size(); ++i) CHECK(g.tensors[i].name == u.tensors[i].name);
}
