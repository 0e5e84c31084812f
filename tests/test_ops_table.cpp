// The operator table (ops/ops.h) through the executor: one case per operator variant, each a
// one-node graph. Where tests/test_ops_<family>.cpp check the kernels' numbers, this checks
// each OpDef's wiring, i.e. what adding an operator adds besides kernels:
//   1. every OpKind has a complete OpDef at its own index, and at least one case below;
//   2. forward + backward through the Executor: every input gradient (activation and
//      parameter) against central finite differences of the executor's own forward, so a
//      wrong pointer, shape or saved tensor (OpDef::saves: an unsaved one is released before
//      the backward) fails;
//   3. the dry run (Executor::simulate) predicts the real run's peaks per account, so a
//      node's scratch is declared where it is allocated (OpDef::scratch).
// Tensor-parallel variants run over a one-rank stand-in of the group (their collectives are
// copies); the multi-rank arithmetic is tests/mpi/test_mpi_layers.cpp's.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/executor.h"
#include "ops/kernel_check.h"
#include "ops/group.h"
#include "ops/node_graph.h"
#include "ops/ops.h"
#include "tests/gradcheck.h"

using namespace gc;
using ops::OpKind;
using ops::TpMode;

namespace {

constexpr int64_t kB = 2, kT = 3, kN = kB * kT;

// A one-node graph under construction. Float activations that the node reads come in as
// the graph's stage input (at most one per case), int ones as tokens / targets; the node's
// first output leaves as the stage output, or as the per-position losses for the loss.
struct Case : ops::NodeGraph {
  std::string name;
  int64_t vocab = 0;         // token / target ids are drawn below this
  float input_scale = 1.0f;  // of the stage input (logits a little larger)

  Case(std::string name_, OpKind kind) : ops::NodeGraph(kind, kB, kT, name_), name(std::move(name_)) {}
  Case& x(std::vector<int64_t> shape) {
    ops::NodeGraph::x(std::move(shape), ops::DType::F32);
    return *this;
  }
  Case& param(const std::string& pname, std::vector<int64_t> shape) {
    ops::NodeGraph::param(pname, std::move(shape), ops::DType::F32);
    return *this;
  }
  Case& tokens(int64_t V) {
    ops::NodeGraph::tokens();
    vocab = V;
    return *this;
  }
  Case& targets(int64_t V) {
    ops::NodeGraph::targets();
    vocab = V;
    return *this;
  }
  Case& out(const std::string& oname, std::vector<int64_t> shape) {
    ops::NodeGraph::out(oname, std::move(shape), ops::DType::F32);
    return *this;
  }
  Case& with(const std::function<void(ops::Node&)>& set) {
    set(n);
    return *this;
  }
  // Adds the node and closes the graph. A fused add + norm: its norm leaves (out[1]), and the
  // sum, which nothing reads here, gets a zeroed gradient from the executor (OpDef::reads_dout1).
  Case& done() {
    ops::NodeGraph::done(n.kind == OpKind::AddLayerNorm || n.kind == OpKind::AddRMSNorm ? 1 : 0);
    return *this;
  }
};

std::vector<Case> cases() {
  const int64_t C = 8, V = 11, H = 5, NH = 2;
  std::vector<Case> cs;
  cs.push_back(Case("embedding (wte + wpe)", OpKind::Embedding)
                   .tokens(V).param("wte", {V, C}).param("wpe", {kT, C}).out("y", {kN, C}).done());
  cs.push_back(Case("embedding (wte only)", OpKind::Embedding).tokens(V).param("wte", {V, C}).out("y", {kN, C}).done());
  cs.push_back(Case("embedding (vocabulary-parallel)", OpKind::Embedding)
                   .tokens(V).param("wte", {V, C}).param("wpe", {kT, C}).out("y", {kN, C})
                   .with([](ops::Node& n) { n.tp = TpMode::VocabEmbed; })
                   .done());
  cs.push_back(Case("layernorm", OpKind::LayerNorm)
                   .x({kN, C}).param("w", {C}).param("b", {C}).out("y", {kN, C}).out("mean", {kN}).out("rstd", {kN})
                   .with([](ops::Node& n) { n.eps = 1e-5f; })
                   .done());
  cs.push_back(Case("layernorm (no bias)", OpKind::LayerNorm)
                   .x({kN, C}).param("w", {C}).out("y", {kN, C}).out("mean", {kN}).out("rstd", {kN})
                   .with([](ops::Node& n) { n.eps = 1e-5f; })
                   .done());
  cs.push_back(Case("rmsnorm", OpKind::RMSNorm)
                   .x({kN, C}).param("w", {C}).out("y", {kN, C}).out("rstd", {kN})
                   .with([](ops::Node& n) { n.eps = 1e-6f; })
                   .done());
  cs.push_back(Case("linear", OpKind::Linear).x({kN, C}).param("W", {H, C}).param("b", {H}).out("y", {kN, H}).done());
  cs.push_back(Case("linear (no bias)", OpKind::Linear).x({kN, C}).param("W", {H, C}).out("y", {kN, H}).done());
  cs.push_back(Case("linear (column-parallel)", OpKind::Linear)
                   .x({kN, C}).param("W", {H, C}).param("b", {H}).out("y", {kN, H})
                   .with([](ops::Node& n) { n.tp = TpMode::Column; })
                   .done());
  cs.push_back(Case("linear (row-parallel)", OpKind::Linear)
                   .x({kN, C}).param("W", {H, C}).param("b", {H}).out("y", {kN, H})
                   .with([](ops::Node& n) { n.tp = TpMode::Row; })
                   .done());
  cs.push_back(Case("rope", OpKind::Rope)
                   .x({kN, 3 * C}).out("y", {kN, 3 * C})
                   .with([](ops::Node& n) { n.heads = NH; n.theta = 10000.0f; })
                   .done());
  for (float p : {0.0f, 0.25f})
    cs.push_back(Case(p > 0 ? "attention (dropout)" : "attention", OpKind::Attention)
                     .x({kN, 3 * C}).out("y", {kN, C}).out("lse", {kB, NH, kT})
                     .with([p](ops::Node& n) { n.heads = NH; n.dropout = p; n.site = 3; })
                     .done());
  // Grouped-query attention: 4 query heads of size 2 over 2 key-value heads (group 2) and
  // multi-query (1); its backward takes a workspace the dry run must count.
  for (int kv : {2, 1}) {
    const int64_t NQ = 4, HS = C / NQ, W = (NQ + 2 * kv) * HS;
    cs.push_back(Case("rope (grouped-query, " + std::to_string(kv) + " kv)", OpKind::Rope)
                     .x({kN, W}).out("y", {kN, W})
                     .with([kv](ops::Node& n) { n.heads = 4; n.kv_heads = kv; n.kv_group = 4 / kv; n.theta = 10000.0f; })
                     .done());
    cs.push_back(Case("attention (grouped-query, " + std::to_string(kv) + " kv, dropout)", OpKind::Attention)
                     .x({kN, W}).out("y", {kN, C}).out("lse", {kB, NQ, kT})
                     .with([kv](ops::Node& n) { n.heads = 4; n.kv_heads = kv; n.kv_group = 4 / kv; n.dropout = 0.25f; n.site = 3; })
                     .done());
  }
  cs.push_back(Case("gelu", OpKind::Gelu).x({kN, H}).out("y", {kN, H}).done());
  cs.push_back(Case("relu2", OpKind::Relu2).x({kN, H}).out("y", {kN, H}).done());
  // fc + GELU fused (the MLP's first half as one node); out[1] is the kept pre-activation.
  cs.push_back(Case("linear_gelu", OpKind::LinearGelu)
                   .x({kN, C}).param("W", {H, C}).param("b", {H}).out("y", {kN, H}).out("pre", {kN, H}).done());
  cs.push_back(Case("linear_gelu (no bias)", OpKind::LinearGelu)
                   .x({kN, C}).param("W", {H, C}).out("y", {kN, H}).out("pre", {kN, H}).done());
  cs.push_back(Case("linear_gelu (column-parallel)", OpKind::LinearGelu)
                   .x({kN, C}).param("W", {H, C}).param("b", {H}).out("y", {kN, H}).out("pre", {kN, H})
                   .with([](ops::Node& n) { n.tp = TpMode::Column; })
                   .done());
  // A residual add and the norm of its sum fused; out = (sum, y, statistics).
  cs.push_back(Case("add_layernorm", OpKind::AddLayerNorm)
                   .x({kN, C}).param("b", {kN, C}).param("w", {C}).param("bias", {C}).out("sum", {kN, C})
                   .out("y", {kN, C}).out("mean", {kN}).out("rstd", {kN})
                   .with([](ops::Node& n) { n.eps = 1e-5f; })
                   .done());
  cs.push_back(Case("add_rmsnorm", OpKind::AddRMSNorm)
                   .x({kN, C}).param("b", {kN, C}).param("w", {C}).out("sum", {kN, C}).out("y", {kN, C})
                   .out("rstd", {kN})
                   .with([](ops::Node& n) { n.eps = 1e-6f; })
                   .done());
  cs.push_back(Case("swiglu", OpKind::SwiGLU).x({kN, 2 * H}).out("y", {kN, H}).done());
  cs.push_back(Case("add", OpKind::Add).x({kN, C}).param("b", {kN, C}).out("y", {kN, C}).done());
  cs.push_back(Case("dropout", OpKind::Dropout)
                   .x({kN, C}).out("y", {kN, C})
                   .with([](ops::Node& n) { n.dropout = 0.25f; n.site = 5; })
                   .done());
  // Logits (N, 9) of which 7 real columns; probabilities in place of the logits, as the model builds it.
  for (bool shard : {false, true}) {
    Case c(shard ? "softmax_xent (vocabulary-parallel)" : "softmax_xent", OpKind::SoftmaxXent);
    c.x({kN, 9}).targets(7).out("losses", {kN}).with([shard](ops::Node& n) {
      n.inplace = true;
      n.vocab_real = 7;
      if (shard) n.tp = TpMode::VocabXent;
    });
    c.input_scale = 2.0f;
    cs.push_back(std::move(c.done()));
  }
  return cs;
}

// The node's graph bound to random parameters, run by an Executor.
struct Bench {
  const ops::Graph& g;
  ops::SoloGroup group;
  std::vector<ops::Tensor> values, grads;
  std::unique_ptr<ops::Executor> ex;
  std::vector<int32_t> tokens, targets;
  Vec stage_in, stage_out, R;  // R: the random weights of L = sum(stage_out * R)
  static constexpr uint64_t kKey = 77;

  explicit Bench(const Case& c, ops::Backend& be = ops::cpu_backend()) : g(c.g) {
    ex = std::make_unique<ops::Executor>(g, be);
    ex->set_group(&group);
    for (size_t k = 0; k < g.params.size(); ++k) {
      const ops::TensorDesc& d = g.tensors[g.params[k]];
      values.push_back(ops::Tensor::zeros(d.shape, ops::DType::F32, ops::Account::Parameters));
      grads.push_back(ops::Tensor::zeros(d.shape, ops::DType::F32, ops::Account::Gradients));
      const Vec v = randn(static_cast<size_t>(values.back().numel()), 100 + k, 0.5f);
      std::memcpy(values.back().raw(), v.data(), v.size() * sizeof(float));
      if (d.name == "w") {  // norm weights around 1
        float* w = values.back().data<float>();
        for (int64_t i = 0; i < values.back().numel(); ++i) w[i] += 1.0f;
      }
    }
    for (size_t k = 0; k < g.params.size(); ++k) ex->bind_param(g.params[k], &values[k], &grads[k]);
    if (c.vocab > 0) {
      tokens = randint(static_cast<size_t>(kN), 5, static_cast<int32_t>(c.vocab));
      targets = randint(static_cast<size_t>(kN), 6, static_cast<int32_t>(c.vocab));
      targets[1] = -1;  // an ignored position
    }
    if (g.stage_input >= 0) stage_in = randn(static_cast<size_t>(numel_of(g.stage_input)), 7, c.input_scale);
    if (g.stage_output >= 0) {
      stage_out.assign(static_cast<size_t>(numel_of(g.stage_output)), 0.0f);
      R = randn(stage_out.size(), 8);
    }
  }
  int64_t numel_of(int id) const { return ops::numel_of(g.tensors[id].shape); }

  // L = sum(stage_out * R), or the sum of the losses.
  double forward() {
    auto ls = ex->forward(tokens.empty() ? nullptr : tokens.data(), targets.empty() ? nullptr : targets.data(), true,
                          kKey, 0, stage_in.empty() ? nullptr : stage_in.data(),
                          stage_out.empty() ? nullptr : stage_out.data());
    if (g.stage_output < 0) return ls.sum;
    double L = 0;
    for (size_t i = 0; i < R.size(); ++i) L += static_cast<double>(stage_out[i]) * R[i];
    return L;
  }
  // dL/d(stage input); parameter gradients land in `grads`.
  Vec backward() {
    Vec dstage_in(stage_in.size(), 0.0f);
    ex->backward(1.0f, R.empty() ? nullptr : R.data(), dstage_in.empty() ? nullptr : dstage_in.data());
    return dstage_in;
  }
};

// Central differences of the executor's fp32 forward at up to 24 coordinates of `x`. With
// inputs of order 1 and h = 1e-2 the truncation error is ~1e-4 and the fp32 rounding of L
// (~1e-7 of sum |out R| over ~50 outputs, divided by 2h) ~1e-4: the 2e-2 tolerance below
// passes any correct wiring and fails any wrong one (an error there is of order 1).
double fd_error(Bench& b, float* x, size_t n, const Vec& got, uint64_t seed) {
  const auto coords = pick_coords(n, 24, seed);
  DVec fd(coords.size());
  Vec g(coords.size());
  for (size_t k = 0; k < coords.size(); ++k) {
    const size_t i = coords[k];
    const float x0 = x[i];
    const float h = 1e-2f;
    x[i] = x0 + h;
    const double lp = b.forward();
    x[i] = x0 - h;
    const double lm = b.forward();
    x[i] = x0;
    fd[k] = (lp - lm) / (2.0 * static_cast<double>(h));
    g[k] = got[i];
  }
  return rel_err(g, fd);
}

}  // namespace

TEST_CASE("operator table: every OpKind has a complete OpDef at its own index") {
  std::set<std::string> names;
  for (int k = 0; k < ops::kOpKinds; ++k) {
    const auto kind = static_cast<OpKind>(k);
    const ops::OpDef& op = ops::op_def(kind);
    CAPTURE(k);
    CHECK(op.kind == kind);
    REQUIRE(op.name != nullptr);
    CHECK(std::string(ops::op_name(kind)) == op.name);
    CHECK(names.insert(op.name).second);  // the profiler tells kinds apart by name
    CHECK(bool(op.saves));
    CHECK(bool(op.forward));
    CHECK(bool(op.backward));
  }
  CHECK(std::string(ops::op_name(OpKind::Count)) == "?");
}

TEST_CASE("operator table: every OpKind has a case below") {
  std::set<int> covered;
  for (const Case& c : cases()) covered.insert(static_cast<int>(c.n.kind));
  for (int k = 0; k < ops::kOpKinds; ++k) {
    CAPTURE(ops::op_name(static_cast<OpKind>(k)));
    CHECK(covered.count(k) == 1);
  }
}

// The figures (ops.h) the planner, the cost model and `runner calibrate` read from each OpDef
// instead of knowing the kind: a kind without them could not be priced or ranked.
TEST_CASE("operator table: every OpDef states its figures, and they are consistent") {
  for (const Case& c : cases()) {
    CAPTURE(c.name);
    const ops::Node& n = c.g.nodes[0];
    const ops::OpDef& op = ops::op_def(n.kind);
    REQUIRE(bool(op.flops));
    REQUIRE(bool(op.traffic));
    CHECK(op.flops(c.g, n, false) > 0);
    CHECK(op.flops(c.g, n, true) > 0);
    const ops::OpTrafficParts t = op.traffic(c.g, n);
    REQUIRE(t.count >= 1);
    REQUIRE(t.count <= static_cast<int>(t.parts.size()));
    for (int i = 0; i < t.count; ++i) {
      const ops::OpTraffic& part = t.parts[static_cast<size_t>(i)];
      CHECK(part.forward >= 0);
      CHECK(part.backward >= 0);
      if (!part.kind) CHECK((part.forward == 0 && part.backward == 0));  // a launch only
    }
    // GEMMs: a Linear's FLOPs are its products', 2mnk each, the backward's two as large as
    // the forward's one.
    if (op.gemms) {
      for (bool backward : {false, true}) {
        const ops::OpGemms gm = op.gemms(c.g, n, backward);
        CHECK(gm.count == (backward ? 2 : 1));
        double f = 0;
        for (int i = 0; i < gm.count; ++i) {
          const ops::GemmShape& s = gm.shapes[static_cast<size_t>(i)];
          f += 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
        }
        if (n.kind == OpKind::Linear) CHECK(op.flops(c.g, n, backward) == f);
        else CHECK(op.flops(c.g, n, backward) > f);  // the fused GELU's work on top
      }
    }
    // Collectives: none without tensor or sequence parallelism; a column-parallel Linear's
    // backward all-reduces d(x), a row-parallel one's forward y.
    const ops::OpCollectives coll = op.collectives ? op.collectives(c.g, n) : ops::OpCollectives{};
    if (n.tp == TpMode::None && !n.gather_input && !n.scatter_output) CHECK(coll.count == 0);
    if ((n.tp == TpMode::Column && !n.gather_input) || (n.tp == TpMode::Row && !n.scatter_output)) {
      REQUIRE(coll.count == 1);
      CHECK(coll.calls[0].op == ops::TpCollective::all_reduce);
      CHECK(coll.calls[0].backward == (n.tp == TpMode::Column));
    }
    if (n.tp == TpMode::VocabEmbed || n.tp == TpMode::VocabXent) CHECK(coll.count >= 1);
    if (op.attention) {
      const ops::AttentionShape a = op.attention(c.g, n);
      CHECK(a.batch_heads % kB == 0);
      CHECK(a.seq == kT);
      CHECK(a.head_dim > 0);
    }
  }
}

// A fused node is priced and counted as the unfused kinds it replaces, so that a plan does not
// depend on model.fuse.
TEST_CASE("operator table: a fused add + norm's figures are the Add's and the norm's") {
  for (const Case& c : cases()) {
    const ops::Node& n = c.g.nodes[0];
    if (n.kind != OpKind::AddLayerNorm && n.kind != OpKind::AddRMSNorm) continue;
    CAPTURE(c.name);
    const ops::OpDef& op = ops::op_def(n.kind);
    const ops::OpDef& norm = ops::op_def(n.kind == OpKind::AddLayerNorm ? OpKind::LayerNorm : OpKind::RMSNorm);
    const double numel = static_cast<double>(ops::numel_of(c.g.tensors[static_cast<size_t>(n.out[0])].shape));
    CHECK(op.flops(c.g, n, false) == (n.kind == OpKind::AddLayerNorm ? 9.0 : 6.0) * numel);
    const ops::OpTrafficParts t = op.traffic(c.g, n);
    REQUIRE(t.count == 2);
    CHECK(std::string(t.parts[0].kind) == "add");
    CHECK(std::string(t.parts[1].kind) == norm.name);
    CHECK(op.residual_outputs == 0b1);  // the sum counts under the residual add's module
  }
  for (int k = 0; k < ops::kOpKinds; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (kind != OpKind::AddLayerNorm && kind != OpKind::AddRMSNorm) CHECK(ops::op_def(kind).residual_outputs == 0);
  }
}

// `runner calibrate` measures a kind's bandwidth on its probe over the bytes its traffic
// states, and the cost model prices the kind's nodes at that bandwidth over the same figure:
// the probe's traffic must name the kind itself.
TEST_CASE("operator table: each bandwidth probe builds a node whose traffic is its own kind's") {
  int probes = 0;
  for (const ops::OpDef* op : ops::kOpTable) {
    if (!op->probe) continue;
    CAPTURE(op->name);
    ++probes;
    ops::NodeGraph b(op->kind, 1, 16);
    ops::NodeGraphProbe probe(b, ops::DType::F32);
    op->probe(probe, 16, 8);
    REQUIRE(!b.n.out.empty());
    const ops::OpTrafficParts t = op->traffic(b.g, b.n);
    REQUIRE(t.count == 1);
    REQUIRE(t.parts[0].kind != nullptr);
    CHECK(std::string(t.parts[0].kind) == op->name);
    CHECK(t.parts[0].forward > 0);
    CHECK(t.parts[0].backward > 0);
  }
  CHECK(probes == 8);  // embedding, the norms, gelu, relu2, swiglu, add, the loss
}

namespace {
// The CPU's kernel table without the entries of the kernels in `withheld`.
struct Withholding final : ops::Backend {
  explicit Withholding(const std::set<ops::Kernel>& withheld) {
    std::apply([&](const auto&... k) { (adopt<std::decay_t<decltype(k)>>(withheld), ...); }, ops::k::AllKernels{});
  }
  template <class K> void adopt(const std::set<ops::Kernel>& withheld) {
    if (withheld.count(K::id)) return;
    for (ops::DType t : {ops::DType::F32, ops::DType::BF16, ops::DType::F16}) {
      const Entry* e = ops::cpu_backend().entry(K::id, t);
      if (e && e->fn) provide<K>(t, [fn = e->fn](const K& a) { fn(&a); }, e->available);
    }
  }
  const char* name() const override { return "withholding"; }
};

std::set<ops::Kernel> declared_kernels(const Case& c) {
  const ops::Node& n = c.g.nodes[0];
  std::set<ops::Kernel> out;
  for (bool backward : {false, true})
    for (ops::Kernel k : ops::op_def(n.kind).kernels(c.g, n, backward, false)) out.insert(k);
  return out;
}
}  // namespace

// OpDef::kernels is what the plan check and the 16-bit-native choice read: it must be what the
// operator runs. Each case runs forward and backward on a backend that lacks every other
// operator's kernels, so an undeclared kernel finds no entry and throws.
TEST_CASE("operator table: each operator runs exactly the kernels its OpDef declares") {
  const std::vector<Case> cs = cases();
  std::set<ops::Kernel> any_op;
  for (const Case& c : cs) {
    REQUIRE(bool(ops::op_def(c.g.nodes[0].kind).kernels));
    for (ops::Kernel k : declared_kernels(c)) any_op.insert(k);
  }
  for (const Case& c : cs) {
    CAPTURE(c.name);
    const std::set<ops::Kernel> own = declared_kernels(c);
    CHECK(!own.empty());
    std::set<ops::Kernel> withheld;
    for (ops::Kernel k : any_op)
      if (!own.count(k)) withheld.insert(k);
    Withholding be(withheld);
    CHECK(ops::missing_kernels(c.g, be, true, false).empty());
    Bench b(c, be);
    CHECK_NOTHROW(b.forward());
    CHECK_NOTHROW(b.backward());
    // And each declared kernel is needed: without it the plan check refuses the graph.
    for (ops::Kernel k : own) {
      Withholding lacking({k});
      CHECK(!ops::missing_kernels(c.g, lacking, true, false).empty());
    }
  }
}

// The 16-bit-native choice is all or nothing over the native16 kinds' kernels, which it reads
// from their OpDefs: a backend lacking one 16-bit entry of any of them runs every kind widened.
TEST_CASE("operator table: 16-bit-native support is every native16 kind's declared 16-bit entries") {
  CHECK(ops::native16_available(ops::cpu_backend(), ops::DType::BF16));
  CHECK(ops::native16_available(ops::cpu_backend(), ops::DType::F16));
  for (const ops::OpDef* op : ops::kOpTable) {
    if (!op->native16) continue;
    CAPTURE(op->name);
    const ops::Graph none{};
    const ops::Node plain{};
    for (ops::Kernel k : op->kernels(none, plain, true, false)) {
      Withholding lacking({k});
      CHECK(!ops::native16_available(lacking, ops::DType::BF16));
    }
  }
  Withholding no_kv({ops::Kernel::KvCacheWrite});  // not a native16 kind's kernel
  CHECK(ops::native16_available(no_kv, ops::DType::BF16));
}

TEST_CASE("operator table: kinds by name, kernels by name") {
  for (const ops::OpDef* op : ops::kOpTable) {
    CAPTURE(op->name);
    const std::optional<OpKind> k = ops::op_kind_named(op->name);
    REQUIRE(k.has_value());
    CHECK(*k == op->kind);
  }
  CHECK(!ops::op_kind_named("softmax").has_value());
  std::vector<std::pair<ops::Kernel, std::string>> structs;  // each args struct's id and name
  std::apply([&](const auto&... k) { (structs.emplace_back(std::decay_t<decltype(k)>::id, std::decay_t<decltype(k)>::name), ...); },
             ops::k::AllKernels{});
  std::set<std::string> names;
  for (const auto& [id, name] : structs) {
    CHECK(std::string(ops::kernel_name(id)) == name);
    names.insert(name);
  }
  CHECK(names.size() == static_cast<size_t>(ops::kKernelCount));
  CHECK(std::string(ops::kernel_name(ops::Kernel::Relu2Backward)) == "Relu2Backward");
  CHECK(std::string(ops::kernel_name(ops::Kernel::Count_)) == "?");
}

TEST_CASE("Graph::add_node refuses a node with more operands than an OpContext carries") {
  ops::Graph g;
  ops::Node n;
  n.kind = OpKind::Add;
  n.name = "too_many";
  for (int i = 0; i <= ops::kMaxOperands; ++i) n.in.push_back(g.add_activation("a", {2}, 0));
  n.out = {g.add_activation("y", {2}, 0)};
  CHECK_THROWS_AS(g.add_node(n), std::logic_error);
  n.in.resize(2);
  n.out.clear();
  CHECK_THROWS_AS(g.add_node(n), std::logic_error);
}

TEST_CASE("operator table: each operator through the executor (gradients vs finite differences, ledger)") {
  for (const Case& c : cases()) {
    INFO("case: " << c.name);
    Bench b(c);

    // 3. the dry run predicts the real run (measured from here: parameters are bound).
    const ops::MemoryEstimate est = ops::Executor::simulate(c.g);
    auto& mt = ops::MemoryTracker::instance();
    const size_t act0 = mt.current(ops::Account::Activations), ws0 = mt.current(ops::Account::Workspace);
    mt.reset_peaks();
    b.forward();
    CHECK(mt.current(ops::Account::Activations) - act0 == est.activations_after_forward);
    const Vec dx = b.backward();
    CHECK(mt.peak(ops::Account::Activations) - act0 == est.peak[static_cast<int>(ops::Account::Activations)]);
    CHECK(mt.peak(ops::Account::Workspace) - ws0 == est.peak[static_cast<int>(ops::Account::Workspace)]);
    CHECK(mt.current(ops::Account::Activations) == act0);
    CHECK(mt.current(ops::Account::Workspace) == ws0);

    // 2. gradients of the stage input and of every parameter.
    std::vector<Vec> dparams;
    for (const ops::Tensor& t : b.grads) dparams.emplace_back(t.data<float>(), t.data<float>() + t.numel());
    if (!b.stage_in.empty()) {
      const double e = fd_error(b, b.stage_in.data(), b.stage_in.size(), dx, 1);
      INFO("d(x) rel err " << e);
      CHECK(e < 2e-2);
    }
    for (size_t k = 0; k < b.values.size(); ++k) {
      const double e = fd_error(b, b.values[k].data<float>(), static_cast<size_t>(b.values[k].numel()), dparams[k],
                                10 + k);
      INFO("d(" << c.g.tensors[c.g.params[k]].name << ") rel err " << e);
      CHECK(e < 2e-2);
    }
  }
}
