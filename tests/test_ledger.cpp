// The memory ledger against published arithmetic.
//
// Static memory: mixed-precision Adam costs 2 + 2 + 12 = 16 bytes per parameter (ZeRO,
// Rajbhandari et al. 2020), ZeRO-1 per device 4P + 12P/N. Activations per layer:
// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
// Models", 16-bit: sbh(34 + 5as/h) with dropout and no parallelism, sbh(10 + 24/t +
// 5as/(ht)) under tensor parallelism t, full recompute 2sbh.
//
// Our graph keeps different tensors than Megatron in three places, and these tests pin our
// numbers as (Megatron's) - (what we do not store) + (what we store in addition):
//  - dropout masks are regenerated from the counter-based RNG, never stored: -2sbh for the
//    two residual dropouts, -as^2b for the attention-probability dropout;
//  - attention keeps no (T,T) tensor at all (flash-style: ops/backend.h): neither the
//    softmax output (2as^2b, Megatron's) nor the dropped probabilities (2as^2b), only each
//    query row's fp32 log-sum-exp, +4asb; the backward recomputes the scores by blocks and
//    regenerates the dropout mask. So all of 5as^2b goes, and 4asb comes back;
//  - LayerNorm keeps its fp32 mean and rstd (8 bytes per row, 2 norms: +16sb), which the
//    paper neglects.
// See docs/ledger.md.
#include <doctest/doctest.h>

#include <algorithm>

#include "ops/executor.h"
#include "runner/model/gpt.h"
#include "runner/plan/plan.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)
#include "tests/support/models.h"

using namespace runner;

namespace {

ModelConfig gpt_model(int64_t h, int64_t a, int64_t s, int64_t layers, double dropout) {
  ModelConfig m = test_support::small_model(1000, s, h, a, layers);
  m.dropout = dropout;
  return m;
}

// Activation bytes held for backward by ONE transformer layer: the difference between a
// model with L and L-1 layers, so embedding and head drop out.
double per_layer_activations(ModelConfig m, int64_t b, int64_t t, const std::string& recompute_modules = "",
                             bool sequence_parallel = false) {
  auto held = [&](int64_t layers) {
    GptSpec spec;
    spec.model = m;
    spec.model.n_layers = layers;
    spec.B = b;
    spec.tp = t;
    spec.sequence_parallel = sequence_parallel;
    spec.act_dtype = ops::DType::BF16;
    spec.recompute.resize(static_cast<size_t>(layers));
    if (!recompute_modules.empty())
      for (auto& r : spec.recompute)
        r = recompute_modules == "full"
                ? ops::ModuleSet{ops::Module::norm, ops::Module::attention, ops::Module::attention_core,
                                 ops::Module::mlp, ops::Module::residual}
                : ops::ModuleSet{parse_enum<RecomputeModule>(recompute_modules).value()};
    return static_cast<double>(ops::Executor::simulate(build_gpt_graph(spec)).activations_after_forward);
  };
  return held(3) - held(2);
}

Recipe recipe_7b(const std::string& grad_accum, int64_t zero, int64_t dp) {
  Recipe r;
  r.name = "7b";
  r.model.vocab_size = 32000;
  r.model.seq_len = 4096;
  r.model.d_model = 4096;
  r.model.n_layers = 32;
  r.model.n_heads = 32;
  r.model.norm = Norm::rmsnorm;
  r.model.activation = Activation::swiglu;
  r.model.position = Position::rope;
  r.model.mlp_ratio = 11008.0 / 4096.0;
  r.model.tie_embeddings = false;
  r.model.bias = false;
  r.precision.compute = FloatFormat::bf16;
  r.precision.grad_accum = parse_enum<FloatFormat>(grad_accum).value();
  r.parallel.dp = dp;
  r.parallel.zero = zero;
  r.batch.micro = 1;
  r.batch.accum = 1;
  r.hardware.device = "h100-80gb";
  r.hardware.devices_per_node = 8;
  return r;
}

}  // namespace

TEST_CASE("mixed-precision Adam: 2 + 2 + 12 = 16 bytes per parameter; a 7B model needs ~112 GB") {
  Plan p = make_plan(recipe_7b("bf16", 0, 1));
  const StageLedger& L = p.stages[0];
  double P = static_cast<double>(L.params);
  CHECK(L.parameters == doctest::Approx(2 * P));
  CHECK(L.gradients == doctest::Approx(2 * P));
  CHECK(L.optimizer == doctest::Approx(12 * P));
  CHECK((L.parameters + L.gradients + L.optimizer) / P == doctest::Approx(16.0));
  // LLaMA-7B's shapes give 6.74e9 parameters: 16 bytes each is 107.8 GB (112 GB for 7e9).
  CHECK(p.param_count == 6738415616);
  CHECK((L.parameters + L.gradients + L.optimizer) / 1e9 == doctest::Approx(16 * 6.738415616).epsilon(1e-9));
  // Our default keeps gradient accumulation in fp32: 2 + 4 + 12 = 18 bytes per parameter.
  Plan q = make_plan(recipe_7b("fp32", 0, 1));
  CHECK((q.stages[0].parameters + q.stages[0].gradients + q.stages[0].optimizer) / P == doctest::Approx(18.0));
}

TEST_CASE("ZeRO stage 1: 4P + 12P/N bytes per device") {
  for (int64_t N : {2, 4, 8, 64}) {
    Plan p = make_plan(recipe_7b("bf16", 1, N));
    const StageLedger& L = p.stages[0];
    double P = static_cast<double>(L.params);
    CHECK((L.parameters + L.gradients + L.optimizer) == doctest::Approx(4 * P + 12 * P / static_cast<double>(N)));
  }
}

TEST_CASE("activations per layer, no parallelism: Korthikanti sbh(34 + 5as/h), less what we regenerate") {
  for (auto [s, b, h, a] : {std::array<int64_t, 4>{128, 2, 256, 4}, {2048, 1, 1024, 16}, {64, 8, 768, 12}}) {
    double sbh = static_cast<double>(s * b * h), as2b = static_cast<double>(a * s * s * b), sb = static_cast<double>(s * b);
    double megatron = sbh * (34.0 + 5.0 * a * s / h);
    CHECK(megatron == doctest::Approx(34 * sbh + 5 * as2b));
    const double asb = static_cast<double>(a * s * b);
    double ours_expected = megatron - (2 * sbh + 5 * as2b) + 4 * asb + 16 * sb;
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, 1) == ours_expected);
    // Without dropout nothing changes for us (masks were never stored).
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.0), b, 1) == ours_expected);
  }
}

TEST_CASE("activations per layer under tensor parallelism t: sbh(10 + 24/t + 5as/(ht))") {
  int64_t s = 256, b = 2, h = 512, a = 8;
  double sbh = static_cast<double>(s * b * h), as2b = static_cast<double>(a * s * s * b), sb = static_cast<double>(s * b);
  const double asb = static_cast<double>(a * s * b);
  for (int64_t t : {1, 2, 4, 8}) {
    double megatron = sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    double ours_expected = megatron - 2 * sbh - 5 * as2b / t + 4 * asb / t + 16 * sb;
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, t) == doctest::Approx(ours_expected).epsilon(1e-12));
  }
}

TEST_CASE("selective recompute of the attention core drops the as^2b terms: sbh(10 + 24/t) less masks") {
  int64_t s = 256, b = 2, h = 512, a = 8;
  double sbh = static_cast<double>(s * b * h), sb = static_cast<double>(s * b);
  for (int64_t t : {1, 2, 4}) {
    double megatron = sbh * (10.0 + 24.0 / t);  // Korthikanti Table 2, selective, no sequence parallelism
    double ours_expected = megatron - 2 * sbh + 16 * sb;
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, t, "attention_core") == ours_expected);
  }
}

TEST_CASE("sequence parallelism with selective recompute: 34sbh/t, less the masks") {
  int64_t s = 256, b = 2, h = 512, a = 8;
  double sbh = static_cast<double>(s * b * h), sb = static_cast<double>(s * b);
  for (int64_t t : {2, 4, 8}) {
    double megatron = 34.0 * sbh / t;  // Korthikanti Table 2: sequence parallel + selective recompute
    double ours_expected = megatron - 2 * sbh / t + 16 * sb / t;
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, t, "attention_core", true) == ours_expected);
    // Without recompute the as^2b/t term returns: sbh(34/t + 5as/(ht)) in the paper.
    // (flash-style attention keeps none of it: -5as^2b/t, +4asb/t for the log-sum-exps).
    double as2b = static_cast<double>(a * s * s * b), asb = static_cast<double>(a * s * b);
    CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, t, "", true) ==
          sbh * (34.0 / t + 5.0 * a * s / (h * t)) - 2 * sbh / t - 5 * as2b / t + 4 * asb / t + 16 * sb / t);
  }
}

TEST_CASE("full recompute keeps only each layer's input: 2sbh") {
  int64_t s = 128, b = 4, h = 256, a = 4;
  CHECK(per_layer_activations(gpt_model(h, a, s, 3, 0.1), b, 1, "full") == 2.0 * s * b * h);
}

TEST_CASE("recompute transient: one layer's internals are rebuilt at a time") {
  Recipe r = recipe_7b("bf16", 0, 1);
  r.model.n_layers = 4;
  r.model.seq_len = 512;
  // A small vocabulary: the backward frees the head's fp32 logits before it rebuilds the last
  // layer, and since attention keeps no (T,T) probabilities a 32000-token head's
  // logits outweigh one layer's internals at this length, which would hide the transient.
  r.model.vocab_size = 4096;
  r.recompute.mode = RecomputeMode::full;
  Plan full = make_plan(r);
  r.recompute.mode = RecomputeMode::none;
  Plan none = make_plan(r);
  const StageLedger &F = full.stages[0], &N = none.stages[0];
  CHECK(F.activations_per_micro < N.activations_per_micro);
  CHECK(F.recompute_transient > 0);
  CHECK(N.recompute_transient == 0);
  // The transient is at most one layer's worth of what no-recompute keeps.
  CHECK(F.recompute_transient <= N.activations_per_micro / 4 + 1);
}

TEST_CASE("1F1B: stage i holds p - i micro-batches; GPipe holds all of them") {
  Recipe r = recipe_7b("bf16", 0, 1);
  r.model.n_layers = 8;
  r.model.seq_len = 256;
  r.parallel.pp = 4;
  r.parallel.dp = 1;
  r.batch.accum = 8;
  Plan p = make_plan(r);
  REQUIRE(p.stages.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(p.stages[i].micro_in_flight == 4 - i);
    CHECK(p.stages[i].activations ==
          doctest::Approx(p.stages[i].activations_per_micro * (4 - i) + p.stages[i].recompute_transient));
  }
  CHECK(p.bubble == doctest::Approx(3.0 / (8 + 3)));
  r.parallel.schedule = PipelineSchedule::gpipe;
  Plan g = make_plan(r);
  for (auto& st : g.stages) CHECK(st.micro_in_flight == 8);
}

TEST_CASE("inference sizing: KV cache per rank and the largest batch that fits") {
  Recipe r = recipe_7b("bf16", 0, 1);
  r.inference = InferenceConfig{4, 4096, KvFormat::fp16};
  Plan p = make_plan(r);
  REQUIRE(p.inference);
  // 2 (K and V) x layers x context x d_model x 2 bytes per sequence.
  double per_seq = 2.0 * 32 * 4096 * 4096 * 2;
  CHECK(p.inference->kv_per_sequence == per_seq);
  CHECK(p.inference->kv_cache == 4 * per_seq);
  double weights = 2.0 * static_cast<double>(p.stages[0].params);
  CHECK(p.inference->weights == weights);
  CHECK(p.inference->max_batch == static_cast<int64_t>((80.0 * (1ull << 30) - weights) / per_seq));
  // int8: one byte per channel and one fp32 scale per head (32 heads), per position.
  r.inference->kv_dtype = KvFormat::int8;
  CHECK(make_plan(r).inference->kv_per_sequence == 2.0 * 32 * 4096 * (4096 * 1 + 32 * 4));
  r.inference->kv_dtype = KvFormat::fp32;
  CHECK(make_plan(r).inference->kv_per_sequence == per_seq * 2);
}

// Grouped-query attention (docs/ledger.md): the qkv projection has n_kv_heads key-value rows,
// not n_heads. Llama 2 70B (8 key-value heads) has 68,976,648,192 parameters; with 64 it
// would be 78,371,889,152, what this recipe planned before n_kv_heads existed. Llama 2 7B is
// full multi-head. Both recipes still fit as their comments say.
TEST_CASE("the Llama 2 recipes plan their models' exact parameter counts (70B with 8 key-value heads) and fit") {
  const std::string dir = std::string(RUNNER_SOURCE_DIR) + "/recipes/";
  Plan p70 = make_plan(load_recipe(dir + "llama-70b-64gpu.yaml"));
  CHECK(p70.recipe.model.kv_heads() == 8);
  CHECK(p70.param_count == 68976648192);
  CHECK(p70.table().find("64 heads (8 key-value)") != std::string::npos);
  CHECK(p70.fits);
  CHECK(p70.worst_stage().total() < 0.6 * p70.device_memory);  // "about half of each GPU's memory"
  CHECK(make_plan(load_recipe(dir + "llama-70b-64gpu.yaml", {"model.n_kv_heads=64"})).param_count == 78371889152);
  // tp 8 does not divide 4 key-value heads: every rank holds all of them, and the plan says so.
  const Plan rep = make_plan(load_recipe(dir + "llama-70b-64gpu.yaml", {"model.n_kv_heads=4"}));
  CHECK(std::any_of(rep.notes.begin(), rep.notes.end(), [](const std::string& n) {
    return n.find("4 key-value heads do not split over tp 8") != std::string::npos;
  }));
  CHECK(rep.stages[0].params > p70.stages[0].params);
  Plan p7 = make_plan(load_recipe(dir + "llama-7b-8xh100.yaml"));
  CHECK(p7.param_count == 6738415616);
  CHECK(p7.fits);
}

// The KV cache holds the key-value heads only: per token and rank it scales with the heads a
// rank holds, n_kv_heads / tp (or all of them when tp does not divide them: replicated).
TEST_CASE("KV-cache bytes per token scale with n_kv_heads (Llama 2 70B: 8 of 64 heads, tp 8, 20 layers per stage)") {
  const std::string path = std::string(RUNNER_SOURCE_DIR) + "/recipes/llama-70b-64gpu.yaml";
  auto per_token = [&](int64_t kv, const char* format) {
    Recipe r = load_recipe(path, {"model.n_kv_heads=" + std::to_string(kv)});
    r.inference = InferenceConfig{1, 4096, parse_enum<KvFormat>(format).value()};
    Plan p = make_plan(r);
    REQUIRE(p.inference);
    return p.inference->kv_per_sequence / 4096.0;
  };
  // 2 (K, V) x 20 layers x (key-value heads on this rank) x head size 128 x 2 bytes.
  CHECK(per_token(64, "bf16") == 2.0 * 20 * 8 * 128 * 2);  // 81,920 bytes: 8 heads per rank
  CHECK(per_token(8, "bf16") == 2.0 * 20 * 1 * 128 * 2);   // 10,240 bytes: one per rank, 8x less
  CHECK(per_token(16, "bf16") == 2.0 * 20 * 2 * 128 * 2);
  CHECK(per_token(4, "bf16") == 2.0 * 20 * 4 * 128 * 2);   // tp 8 does not divide 4: all 4 on every rank
  CHECK(per_token(8, "int8") == 2.0 * 20 * 1 * (128 + 4));  // int8: one fp32 scale per key-value head
}

// ZeRO shards over dp only, each stage one more account: 1 the optimizer states, 2 the
// gradients, 3 the parameters; the communication account holds what is in flight (docs/
// parallel.md). A small Llama-style model, untied, no biases, counted by hand: C 32, MLP 128
// (SwiGLU: 2 x 128 rows in, 128 out), vocabulary 64, 4 layers. Per layer: two norms 2C, qkv
// 3C^2, projection C^2, MLP 3HC: 64 + 4096 + 12288 = 16448; before the layers the embedding
// VC = 2048; after them the final norm and the head, C + VC = 2080. bf16 compute, fp32
// gradients (g 4), fp32 master and moments (12).
TEST_CASE("ZeRO 0/1/2/3 per rank, exact bytes, alone and under tp 2 x pp 2") {
  const std::string text =
      "name: z\n"
      "model: {vocab_size: 64, seq_len: 16, d_model: 32, n_layers: 4, n_heads: 2, norm: rmsnorm, activation: swiglu,\n"
      "        position: rope, tie_embeddings: false, bias: false, dropout: 0.0}\n"
      "batch: {micro: 2, accum: 1}\n"
      "precision: {compute: bf16}\n";
  auto plan = [&](int zero, std::vector<std::string> sets) {
    sets.push_back("parallel.zero=" + std::to_string(zero));
    return make_plan(load_recipe_text(text, "z.yaml", sets));
  };
  const double layer = 16448, before = 2048, after = 2080;
  SUBCASE("dp 4 alone") {
    const std::vector<std::string> sets = {"parallel.dp=4", "parallel.bucket_mb=0.000001"};  // a bucket per parameter
    const Plan p0 = plan(0, sets);
    const StageLedger& L0 = p0.stages[0];
    const double P = before + 4 * layer + after;
    REQUIRE(static_cast<double>(L0.params) == P);  // 69920
    CHECK(L0.parameters == 2 * P);
    CHECK(L0.gradients == 4 * P);
    CHECK(L0.optimizer == 12 * P);
    struct Want { int zero; double parameters, gradients, optimizer, communication; };
    // zero 1: the received pieces, P/4 x 4 bytes. zero 2: the two largest buckets in full
    // size, here the two largest parameters: two MLP-in weights, 2 x 2HC = 2 x 8192 elements.
    // zero 3: two whole layers gathered in bf16 and one layer's full fp32 gradients.
    const Want wants[] = {{1, 2 * P, 4 * P, 3 * P, P},
                          {2, 2 * P, P, 3 * P, 2 * 8192 * 4},
                          {3, P / 2, P, 3 * P, 2 * layer * 2 + layer * 4}};
    for (const Want& w : wants) {
      INFO("zero " << w.zero);
      const StageLedger L = plan(w.zero, sets).stages[0];
      CHECK(L.params == L0.params);  // the elements this rank computes with, sharded or not
      CHECK(L.parameters == w.parameters);
      CHECK(L.gradients == w.gradients);
      CHECK(L.optimizer == w.optimizer);
      CHECK(L.communication - L0.communication == w.communication);
      CHECK(L.activations == L0.activations);
    }
    // Kept gathered from forward to backward: every layer's weights, not two.
    std::vector<std::string> keep = sets;
    keep.push_back("parallel.reshard_after_forward=false");
    const StageLedger K = plan(3, keep).stages[0];
    CHECK(K.communication - L0.communication == 2 * P + layer * 4);
    // A smaller footprint at every stage, the table says what is divided.
    CHECK(plan(3, sets).worst_stage().total() < plan(2, sets).worst_stage().total());
    CHECK(plan(2, sets).worst_stage().total() < plan(1, sets).worst_stage().total());
    const std::string table = plan(3, sets).table();
    CHECK(table.find("ZeRO-3: parameters, gradients and optimizer states divided by dp 4") != std::string::npos);
    CHECK(table.find("parameters /dp 4") != std::string::npos);
    CHECK(table.find("gradients /dp 4") != std::string::npos);
    CHECK(table.find("optimizer states /dp 4") != std::string::npos);
    const nlohmann::json j = plan(3, sets).to_json()["zero"];
    CHECK(j["stage"] == 3);
    CHECK(j["divided_by_dp"] == nlohmann::json::array({"parameters", "gradients", "optimizer"}));
    CHECK(plan(1, sets).to_json()["zero"]["divided_by_dp"] == nlohmann::json::array({"optimizer"}));
  }
  SUBCASE("dp 4 x tp 2 x pp 2: this rank's tp and pp shard divided by dp") {
    // tp 2 halves every matrix and the vocabulary rows; the norms are replicated: a layer is
    // 2C + (4C^2 + 3HC) / 2 = 8256, the embedding 1024, the final norm and head 32 + 1024.
    const double tlayer = 8256, tbefore = 1024, tafter = 1056;
    const std::vector<std::string> sets = {"parallel.dp=4", "parallel.tp=2", "parallel.pp=2", "batch.accum=2"};
    const Plan p0 = plan(0, sets);
    const double P[2] = {tbefore + 2 * tlayer, 2 * tlayer + tafter};
    for (int zero : {1, 2, 3}) {
      const Plan p = plan(zero, sets);
      for (int s = 0; s < 2; ++s) {
        INFO("zero " << zero << ", stage " << s);
        const StageLedger& L = p.stages[static_cast<size_t>(s)];
        REQUIRE(static_cast<double>(L.params) == P[s]);
        CHECK(L.parameters == 2 * P[s] / (zero >= 3 ? 4 : 1));
        CHECK(L.gradients == 4 * P[s] / (zero >= 2 ? 4 : 1));
        CHECK(L.optimizer == 12 * P[s] / 4);
        // One bucket (25 MiB) holds the whole stage: under zero 2 it is in flight in full
        // (padded to dp: 17536 and 17568 are multiples of 4).
        const double dp_comm = zero == 1 ? P[s] : zero == 2 ? 4 * P[s] : 2 * tlayer * 2 + tlayer * 4;
        CHECK(L.communication - p0.stages[static_cast<size_t>(s)].communication == dp_comm);
      }
    }
  }
}

TEST_CASE("recipes/llama-7b-zero3.yaml: a 7B model on 8 x 80 GB fits with ZeRO-3, not replicated") {
  const std::string file = std::string(RUNNER_SOURCE_DIR) + "/recipes/llama-7b-zero3.yaml";
  for (int zero : {0, 1, 2, 3}) {
    const Plan p = make_plan(load_recipe(file, {"parallel.zero=" + std::to_string(zero)}));
    const StageLedger& L = p.stages[0];
    MESSAGE("llama-7b-zero3 at zero " << zero << ": parameters " << L.parameters / 1e9 << " GB, gradients "
            << L.gradients / 1e9 << ", optimizer " << L.optimizer / 1e9 << ", activations " << L.activations / 1e9
            << ", workspace " << L.workspace / 1e9 << ", communication " << L.communication / 1e9 << ", total "
            << L.total() / 1e9 << " of " << p.device_memory / 1e9 << std::string(p.fits ? ": fits" : ": does not fit"));
    CHECK(p.param_count == 6738415616);
    const double P = 6738415616.0;
    CHECK(L.parameters + L.gradients + L.optimizer ==
          doctest::Approx(zero == 0 ? 18 * P : zero == 1 ? 6 * P + 12 * P / 8 : zero == 2 ? 2 * P + 16 * P / 8 : 18 * P / 8));
    CHECK(p.fits == (zero != 0));
  }
  const Plan p3 = make_plan(load_recipe(file));
  CHECK(p3.recipe.parallel.zero == 3);
  CHECK(p3.fits);
  // Two Llama layers gathered in bf16 (202,383,360 parameters each) and one layer's fp32 gradients.
  const double layer = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008 + 2 * 4096;
  CHECK(layer == 202383360.0);
  CHECK(p3.stages[0].communication == 2 * layer * 2 + layer * 4);
}
