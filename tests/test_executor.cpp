// The executor: recompute changes memory, never numbers; the dry run that the ledger
// uses predicts the real run's per-account peaks (invariant 4).
#include <doctest/doctest.h>

#include <cstring>

#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/kernel_check.h"
#include "ops/rng.h"
#include "runner/model/gpt.h"
#include "runner/train/optimizer.h"
#include "tests/support/device.h"
#include "tests/support/models.h"

using namespace runner;

namespace {

// gpt, llama; and grouped-query attention: "gqa" (llama, 4 query heads over 2 key-value
// heads) and "mqa" (gpt with biases, one key-value head).
ModelConfig small_model(const std::string& family) {
  ModelConfig m = test_support::small_model(97, 32, 64, 4, 3);
  m.dropout = 0.1;
  if (family == "llama" || family == "gqa") test_support::make_llama(m);
  if (family == "gqa") m.n_kv_heads = 2;
  if (family == "mqa") m.n_kv_heads = 1;
  return m;
}

struct Run {
  ops::Graph g;
  ParamSet ps;
  std::unique_ptr<ops::Executor> ex;
  Run(const ModelConfig& m, int64_t B, const std::string& recompute) {
    ops::Backend& be = test_support::test_device();  // before any tensor (strict: device memory)
    GptSpec spec;
    spec.model = m;
    spec.B = B;
    RecomputeConfig rc;
    if (recompute == "full") rc.mode = RecomputeMode::full;
    else if (!recompute.empty()) { rc.mode = RecomputeMode::selective; rc.modules = {parse_enum<RecomputeModule>(recompute).value()}; }
    spec.recompute = recompute_sets(rc, m.n_layers);
    g = build_gpt_graph(spec);
    ps = init_params(g, m, 7);
    ex = std::make_unique<ops::Executor>(g, be);
    bind_params(*ex, g, ps);
  }
};

std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(ops::rng_u32(seed, static_cast<uint64_t>(i)) % V);
  return t;
}

}  // namespace

TEST_CASE("recompute (selective and full) gives bit-identical losses and gradients") {
  for (const char* family : {"gpt", "llama", "gqa", "mqa"}) {
    ModelConfig m = small_model(family);
    int64_t B = 2, N = B * m.seq_len;
    auto tokens = random_tokens(N, m.vocab_size, 1), targets = random_tokens(N, m.vocab_size, 2);
    targets[3] = -1;
    Run base(m, B, "");
    auto l0 = base.ex->forward(tokens.data(), targets.data(), true, 42, 0);
    base.ex->backward(1.0f / static_cast<float>(l0.count));
    for (const char* rc : {"attention_core", "mlp", "norm", "attention", "full"}) {
      CAPTURE(family);
      CAPTURE(rc);
      Run r(m, B, rc);
      bool any = false;
      for (auto& n : r.g.nodes) any |= n.recompute;
      CHECK(any);
      auto l1 = r.ex->forward(tokens.data(), targets.data(), true, 42, 0);
      r.ex->backward(1.0f / static_cast<float>(l1.count));
      CHECK(l1.sum == l0.sum);
      for (size_t i = 0; i < base.ps.grads.size(); ++i)
        CHECK_MESSAGE(test_support::host_bytes(base.ps.grads[i]) == test_support::host_bytes(r.ps.grads[i]),
                      base.ps.names[i]);
    }
  }
}

TEST_CASE("dropout masks depend on the key and the global sample position, not on the micro-batch split") {
  ModelConfig m = small_model("gpt");
  int64_t T = m.seq_len;
  auto tokens = random_tokens(4 * T, m.vocab_size, 3), targets = random_tokens(4 * T, m.vocab_size, 4);
  Run whole(m, 4, "");
  auto lw = whole.ex->forward(tokens.data(), targets.data(), true, 99, 0);
  whole.ex->backward(1.0f);
  Run halves(m, 2, "");
  double sum = 0;
  for (int k = 0; k < 2; ++k) {
    auto l = halves.ex->forward(tokens.data() + k * 2 * T, targets.data() + k * 2 * T, true, 99, k * 2);
    halves.ex->backward(1.0f);
    sum += l.sum;
  }
  CHECK(sum == doctest::Approx(lw.sum).epsilon(1e-6));
  for (size_t i = 0; i < whole.ps.grads.size(); ++i) {
    const std::vector<float> a = test_support::host_values(whole.ps.grads[i]);
    const std::vector<float> b = test_support::host_values(halves.ps.grads[i]);
    double num = 0, den = 0;
    for (int64_t k = 0; k < whole.ps.grads[i].numel(); ++k) { num += (a[k] - b[k]) * (a[k] - b[k]); den += a[k] * a[k]; }
    CHECK_MESSAGE(num <= 1e-10 * den + 1e-20, whole.ps.names[i]);
  }
  // A different key draws different masks.
  Run other(m, 4, "");
  auto lo = other.ex->forward(tokens.data(), targets.data(), true, 100, 0);
  CHECK(lo.sum != lw.sum);
}

TEST_CASE("ledger honesty: the dry run predicts each account's measured peak") {
  for (const char* family : {"gpt", "llama", "gqa", "mqa"}) {  // grouped-query: the backward's workspace
    for (const char* rc : {"", "attention_core", "full"}) {
      CAPTURE(family);
      CAPTURE(rc);
      ModelConfig m = small_model(family);
      int64_t B = 3;
      Run r(m, B, rc);
      auto tokens = random_tokens(B * m.seq_len, m.vocab_size, 5), targets = random_tokens(B * m.seq_len, m.vocab_size, 6);
      ops::MemoryEstimate est = ops::Executor::simulate(r.g);
      auto& mt = ops::MemoryTracker::instance();
      size_t act0 = mt.current(ops::Account::Activations), ws0 = mt.current(ops::Account::Workspace);
      mt.reset_peaks();
      auto l = r.ex->forward(tokens.data(), targets.data(), true, 1, 0);
      size_t after_forward = mt.current(ops::Account::Activations) - act0;
      r.ex->backward(1.0f / static_cast<float>(l.count));
      size_t act_peak = mt.peak(ops::Account::Activations) - act0;
      size_t ws_peak = mt.peak(ops::Account::Workspace) - ws0;
      CHECK(after_forward == est.activations_after_forward);
      CHECK(act_peak == est.peak[static_cast<int>(ops::Account::Activations)]);
      CHECK(ws_peak == est.peak[static_cast<int>(ops::Account::Workspace)]);
      CHECK(mt.current(ops::Account::Activations) == act0);  // everything released after backward
      CHECK(mt.current(ops::Account::Workspace) == ws0);
    }
  }
}

TEST_CASE("parameter initialisation is a function of (seed, name, logical element): tp shards agree") {
  // gqa: 2 key-value heads split over tp 2; mqa: 1 replicated on both ranks.
  for (const char* family : {"gpt", "gqa", "mqa"}) {
    CAPTURE(family);
    ModelConfig m = small_model(family);
    GptSpec full;
    full.model = m;
    ops::Graph g1 = build_gpt_graph(full);
    test_support::test_device();  // the values are written in through the crossing
    ParamSet p1 = init_params(g1, m, 11);
    for (int64_t rank = 0; rank < 2; ++rank) {
      GptSpec sh = full;
      sh.tp = 2;
      sh.tp_rank = rank;
      sh.vocab_padded = 98;
      ops::Graph g2 = build_gpt_graph(sh);
      ParamSet p2 = init_params(g2, m, 11);
      int qi = p2.index("h.1.attn.qkv.weight");
      int fi = p1.index("h.1.attn.qkv.weight");
      REQUIRE(qi >= 0);
      const ops::TensorDesc& d = g2.tensors[static_cast<size_t>(g2.find("h.1.attn.qkv.weight"))];
      const std::vector<float> shard = test_support::host_values(p2.values[static_cast<size_t>(qi)]);
      const std::vector<float> whole = test_support::host_values(p1.values[static_cast<size_t>(fi)]);
      for (int64_t i = 0; i < p2.values[static_cast<size_t>(qi)].numel(); ++i)
        REQUIRE(shard[i] == whole[shard_to_full_index(d, i)]);
      // Rows: this rank's 2 of 4 query heads (head size 16), then its key-value heads' k and v.
      const int64_t kv_rows = m.kv_heads() == 1 ? 16 : 16 * m.kv_heads() / 2;
      CHECK(d.shape[0] == 2 * 16 + 2 * kv_rows);
      CHECK(d.full_shape[0] == 4 * 16 + 2 * 16 * m.kv_heads());
    }
  }
}

namespace {
// A backend with an empty kernel table (its memory is the host's).
struct NoKernels final : ops::Backend {
  const char* name() const override { return "no-kernels"; }
};
}  // namespace

TEST_CASE("plan check: an entry a backend lacks refuses the run before any step, naming operator, kernel, dtype") {
  GptSpec spec;
  spec.model = small_model("gpt");
  spec.B = 2;
  const ops::Graph g = build_gpt_graph(spec);
  // The CPU backend has every kernel a training graph and a KV-cache prefill need.
  CHECK(ops::missing_kernels(g, ops::cpu_backend(), true, true).empty());
  NoKernels none;
  const std::vector<ops::MissingKernel> miss = ops::missing_kernels(g, none, true, false);
  REQUIRE(!miss.empty());
  CHECK(miss.front().dtype == ops::DType::F32);
  try {
    ops::check_kernels(g, none, false, true);
    FAIL("check_kernels did not throw");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("no-kernels backend") != std::string::npos);
    CHECK(msg.find(g.nodes[0].name) != std::string::npos);
    CHECK(msg.find("EmbeddingForward, fp32") != std::string::npos);
    CHECK(msg.find("KvCacheWrite") != std::string::npos);
    CHECK(msg.find("--no-kv-cache") != std::string::npos);
  }
  CHECK_THROWS_AS(ops::Executor(g, none), std::runtime_error);
  // A kernel run without an entry: one logic_error naming backend, kernel and dtype.
  float x = 1.0f;
  try {
    none.run(ops::k::Scale(&x, 1, 2.0f), ops::DType::BF16);
    FAIL("run did not throw");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("no-kernels backend: no Scale kernel for bf16") != std::string::npos);
  }
}
