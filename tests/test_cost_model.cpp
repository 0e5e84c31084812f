// The cost model (runner/perf/cost.h) against hand-computed cases.
//
// A hardware profile built by hand (one GEMM rate, so a GEMM of m x n x k takes 2mnk / rate;
// one bandwidth for the memory-bound operators; known links) and a tiny GPT (vocab 64, seq 16,
// d_model 32, 2 layers, 2 heads, micro-batch 2: 32 rows per micro-batch). The GEMM FLOPs and
// the bytes of every memory-bound operator are counted here from the model's architecture,
// not from the graph, so a node the cost model misses or double counts shows. Attention and
// collectives are priced by the profile's own functions at the shapes and sizes counted here
// (their formulas are the profile's, tested with it).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "runner/perf/cost.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"

using namespace runner;

namespace {

const char* kTiny = R"(name: cost
model: {vocab_size: 64, seq_len: 16, d_model: 32, n_layers: 2, n_heads: 2, dropout: 0.0}
parallel: {dp: 1}
batch: {global: 2, micro: 2}
train: {threads: 1}
)";

Plan plan_of(std::vector<std::string> sets) { return make_plan(load_recipe_text(kTiny, "t.yaml", std::move(sets))); }

constexpr double kGemmRate = 1e9, kOpBandwidth = 1e9;

// One thread at the rates above, two threads at twice them.
HardwareProfile hand_profile() {
  HardwareProfile hw;
  hw.device = "cpu";
  hw.source = "test";
  hw.cores = 4;
  for (int threads : {1, 2}) {
    const double x = threads;
    ComputeProfile c;
    c.threads = threads;
    c.gemm["fp32"] = {GemmRate{64, 64, 64, x * kGemmRate}};
    c.attention["fp32"] = {AttentionRate{16, 16, x * 2e9, x * 1e9}};
    c.memory_bandwidth = 1e11;  // the GEMMs' roofline and the optimizer: never binding here
    for (const char* op : {"embedding", "layernorm", "linear", "add", "gelu", "softmax_xent"})
      c.op_bandwidth[op] = x * kOpBandwidth;
    c.launch_s = 0;
    hw.compute.push_back(c);
  }
  hw.intra_node = {1e-6, 1e10};
  hw.inter_node = {2e-5, 1e9};
  hw.peak_flops_fp32 = 1e10;
  return hw;
}

// The tiny model's sizes: rows R = B*T, width C, MLP width H, vocabulary V.
constexpr double R = 32, C = 32, H = 128, V = 64, kLayers = 2;

// GEMM FLOPs of one layer's forward: qkv (C -> 3C), attention projection, MLP in and out.
constexpr double kLayerGemmFlops = 2 * R * (3 * C * C + C * C + H * C + C * H);
constexpr double kHeadGemmFlops = 2 * R * V * C;
// Memory-bound bytes (fp32), as `runner calibrate` counts them for each kind's bandwidth, in
// units of the output: layernorm, gelu, embedding 2 forward and 3 backward; residual add 3 and
// 3; a linear's bias: added (read, write y) forward, its gradient a column sum of dY backward;
// the loss 2 and 2 of its (R, V) logits. One layer: two norms, four biases (qkv 3C, projection
// C, MLP in H and out C), two residual adds, gelu.
constexpr double kLayerBytes = 4 * R * (2 * C + 2 * 3 * C + 2 * C + 3 * C + 2 * C + 2 * H + 2 * H + 2 * C + 3 * C);
constexpr double kLayerBwdBytes = 4 * R * (2 * 3 * C + 2 * 3 * C + 3 * H + (3 * C + C + H + C));
// Outside the layers: the embedding, ln_f, the loss.
constexpr double kFwdBytes = kLayers * kLayerBytes + 4 * R * (2 * C + 2 * C + 2 * V);
constexpr double kBwdBytes = kLayers * kLayerBwdBytes + 4 * R * (3 * C + 3 * C + 2 * V);

double attention_s(const HardwareProfile& hw, bool backward) {
  return hw.attention_seconds("fp32", 2 * 2, 16, 16, backward, 1);  // B x heads sequences of 16, head size 16
}

double sum_breakdown(const StepCost& c) {
  return c.compute + c.recompute + c.bubble + c.optimizer + c.data + c.comm_exposed_s();
}

}  // namespace

TEST_CASE("compute is the hand-counted GEMMs, attention and memory-bound bytes of the forward and backward") {
  const HardwareProfile hw = hand_profile();
  const Plan p = plan_of({});
  REQUIRE(p.accum == 1);
  const StepCost c = predict_step(p, hw);
  const double gemm = 3 * (kLayers * kLayerGemmFlops + kHeadGemmFlops) / kGemmRate;  // forward, dX, dW
  const double attention = kLayers * (attention_s(hw, false) + attention_s(hw, true));
  const double pointwise = (kFwdBytes + kBwdBytes) / kOpBandwidth;
  CHECK(c.compute == doctest::Approx(gemm + attention + pointwise).epsilon(1e-9));
  CHECK(c.recompute == 0);
  CHECK(c.bubble == 0);
  CHECK(c.threads == 1);
  CHECK(c.step_s == doctest::Approx(sum_breakdown(c)).epsilon(1e-12));
  CHECK(c.tokens_per_s == doctest::Approx(32 / c.step_s));
  CHECK(c.tflops_per_device == doctest::Approx(p.flops_per_token * 32 / c.step_s / 1e12));
  CHECK(c.mfu == doctest::Approx(p.flops_per_token * 32 / c.step_s / hw.peak_flops_fp32));

  SUBCASE("every node is one op call forward and one backward") {
    HardwareProfile slow = hw;
    slow.compute[0].launch_s = 1e-6;
    const double nodes = 1 + kLayers * 10 + 3;  // embed; ln1 qkv core proj add ln2 fc gelu proj add; ln_f head loss
    CHECK(predict_step(p, slow).compute == doctest::Approx(c.compute + 2 * nodes * 1e-6).epsilon(1e-9));
  }
  SUBCASE("micro-batches multiply the passes") {
    const StepCost c4 = predict_step(plan_of({"batch.global=8"}), hw);
    CHECK(c4.compute == doctest::Approx(4 * c.compute).epsilon(1e-9));
  }
}

TEST_CASE("bf16: the output layer's backward is priced at fp32's rate unless precision.logits_grad rounds d(logits)") {
  // bf16 GEMMs four times as fast as fp32's. The logits are fp32: under logits_grad fp32 the
  // executor widens the output layer's backward (dX and dW) and runs sgemm; under compute both
  // read bf16. Every other node is priced alike in the two plans.
  HardwareProfile hw = hand_profile();
  for (ComputeProfile& c : hw.compute) {
    c.gemm["bf16"] = {GemmRate{64, 64, 64, 4 * c.threads * kGemmRate}};
    c.attention["bf16"] = c.attention["fp32"];
  }
  hw.peak_flops_bf16 = 4e10;
  const StepCost wide = predict_step(plan_of({"precision.compute=bf16"}), hw);
  const StepCost lg = predict_step(plan_of({"precision.compute=bf16", "precision.logits_grad=compute"}), hw);
  const double head_bwd = 2 * kHeadGemmFlops;  // dX and dW
  CHECK(wide.compute - lg.compute == doctest::Approx(head_bwd / kGemmRate - head_bwd / (4 * kGemmRate)).epsilon(1e-9));
  // The layers' GEMMs and the head's forward at bf16's rate in both.
  const StepCost f32 = predict_step(plan_of({}), hw);
  const double gemm32 = 3 * (kLayers * kLayerGemmFlops + kHeadGemmFlops) / kGemmRate;
  CHECK(f32.compute - lg.compute > 0.7 * gemm32);
  // A GPU's profile models published runs (16-bit GEMMs throughout): the head at bf16's rate
  // either way.
  const StepCost gpu_wide = predict_step(plan_of({"precision.compute=bf16", "hardware.device=h100-80gb"}), hw);
  const StepCost gpu_lg = predict_step(
      plan_of({"precision.compute=bf16", "hardware.device=h100-80gb", "precision.logits_grad=compute"}), hw);
  CHECK(gpu_wide.compute == doctest::Approx(gpu_lg.compute).epsilon(1e-12));
}

TEST_CASE("recompute full adds exactly the layers' forward; selective adds its modules' forward") {
  const HardwareProfile hw = hand_profile();
  const StepCost none = predict_step(plan_of({}), hw);
  const StepCost full = predict_step(plan_of({"recompute.mode=full"}), hw);
  const double layer_forward = kLayerGemmFlops / kGemmRate + attention_s(hw, false) + kLayerBytes / kOpBandwidth;
  CHECK(full.compute == doctest::Approx(none.compute).epsilon(1e-12));
  CHECK(full.recompute == doctest::Approx(kLayers * layer_forward).epsilon(1e-9));
  CHECK(full.step_s == doctest::Approx(none.step_s + full.recompute).epsilon(1e-9));
  // The MLP: its two GEMMs, two bias adds and gelu.
  const StepCost mlp = predict_step(plan_of({"recompute.mode=selective", "recompute.modules=[mlp]"}), hw);
  const double mlp_forward = 2 * R * 2 * H * C / kGemmRate + 4 * R * (2 * H + 2 * H + 2 * C) / kOpBandwidth;
  CHECK(mlp.recompute == doctest::Approx(kLayers * mlp_forward).epsilon(1e-9));
}

// Everything but the GEMMs free: stages of equal GEMM work are equal stages.
HardwareProfile gemm_only_profile() {
  HardwareProfile hw = hand_profile();
  for (ComputeProfile& c : hw.compute) {
    c.memory_bandwidth = 1e30;
    for (auto& [op, bw] : c.op_bandwidth) bw = 1e30;
    c.attention["fp32"] = {AttentionRate{16, 16, 1e30, 1e30}};
  }
  hw.peak_flops_fp32 = 0;  // no bound on the attention's rate
  return hw;
}

TEST_CASE("the pipeline bubble: the other stages' fill and drain, plan.bubble's share with equal stages") {
  // A head of vocabulary 24C is two layers' GEMMs: stage splits [3, 1] and, with 2 chunks per
  // stage, [4, 2] give every stage the same work.
  const HardwareProfile hw = gemm_only_profile();
  const std::vector<std::string> head2 = {"model.tie_embeddings=false", "model.vocab_size=768", "parallel.pp=2",
                                          "batch.global=8"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), head2.begin(), head2.end());
    return plan_of(more);
  };
  // The gradient norm's all-reduce over the world is counted with pp here (no dp, no tp).
  const double norm = hw.collective_seconds(Collective::all_reduce, 2, 16, false);
  auto pipelined = [&](const StepCost& c) { return c.compute + c.recompute + c.comm_exposed.at("pp") - norm + c.bubble; };
  SUBCASE("1F1B and GPipe: (p-1)/(m+p-1)") {
    for (const char* sched : {"1f1b", "gpipe"}) {
      const Plan p = with({"model.n_layers=4", "parallel.stage_layers=[3,1]", std::string("parallel.schedule=") + sched});
      REQUIRE(p.accum == 4);
      const StepCost c = predict_step(p, hw);
      CHECK(c.bubble > 0);
      CHECK(c.bubble / pipelined(c) == doctest::Approx(1.0 / 5.0).epsilon(1e-9));
      CHECK(c.bubble / pipelined(c) == doctest::Approx(p.bubble).epsilon(1e-9));
      CHECK(c.step_s == doctest::Approx(sum_breakdown(c)).epsilon(1e-12));
    }
  }
  SUBCASE("interleaved, 2 chunks per stage: (p-1)/(v*m+p-1)") {
    const Plan p = with({"model.n_layers=6", "parallel.stage_layers=[4,2]", "parallel.schedule=interleaved",
                         "parallel.virtual_stages=2"});
    const StepCost c = predict_step(p, hw);
    CHECK(c.bubble / pipelined(c) == doctest::Approx(1.0 / 9.0).epsilon(1e-9));
    CHECK(c.bubble / pipelined(c) == doctest::Approx(p.bubble).epsilon(1e-9));
  }
}

TEST_CASE("unequal stages: the slow last stage waits for the first stage's forward and backward only") {
  const HardwareProfile hw = hand_profile();
  const Plan p = plan_of({"parallel.pp=2", "batch.global=8", "model.tie_embeddings=false"});
  const StepCost c = predict_step(p, hw);
  // Stage 0: the embedding and layer 0, and the receive of its output's gradient; stage 1 (layer
  // 1, ln_f, the head and the loss) is the slower.
  const double msg = hw.collective_seconds(Collective::send_recv, 2, 4 * R * C, false);
  const double stage0 = 3 * kLayerGemmFlops / kGemmRate + attention_s(hw, false) + attention_s(hw, true) +
                        (kLayerBytes + kLayerBwdBytes + 4 * R * (2 * C + 3 * C)) / kOpBandwidth + msg;
  CHECK(c.bubble == doctest::Approx(stage0).epsilon(1e-9));
  CHECK(c.compute > 4 * (stage0 - msg));  // the critical stage is the last
  // The pipeline messages: (B*T, C) activations received forward, gradients backward, per micro-batch.
  const double norm = hw.collective_seconds(Collective::all_reduce, 2, 16, false);
  CHECK(c.comm_exposed.at("pp") == doctest::Approx(4 * msg + norm).epsilon(1e-9));    // one receive per micro-batch
  CHECK(c.comm_total.at("pp") == doctest::Approx(2 * 4 * msg + norm).epsilon(1e-9));  // and one send
}

TEST_CASE("tensor-parallel collectives counted per layer and priced at the node's level") {
  const HardwareProfile hw = hand_profile();
  auto ar = [&](double bytes) { return hw.collective_seconds(Collective::all_reduce, 2, bytes, false); };
  auto ag = [&](double bytes) { return hw.collective_seconds(Collective::all_gather, 2, bytes, false); };
  auto rs = [&](double bytes) { return hw.collective_seconds(Collective::reduce_scatter, 2, bytes, false); };
  const double act = 4 * R * C;  // one micro-batch's (B*T, C) in fp32
  // The loss: the row max, then the sum-exp and target logit per row; the gradient norm over the world.
  const double loss_and_norm = ar(4 * R) + ar(8 * R) + ar(16);
  SUBCASE("Megatron: two all-reduces forward and two backward per layer, the embedding's and the head's") {
    const StepCost c = predict_step(plan_of({"parallel.tp=2"}), hw);
    const double expect = (kLayers * 4 + 2) * ar(act) + loss_and_norm;
    CHECK(c.comm_total.at("tp") == doctest::Approx(expect).epsilon(1e-9));
    CHECK(c.comm_exposed.at("tp") == doctest::Approx(expect).epsilon(1e-9));  // blocking: never hidden
    CHECK(c.step_s == doctest::Approx(sum_breakdown(c)).epsilon(1e-12));
  }
  SUBCASE("sequence parallelism: all-gathers and reduce-scatters, and the partial gradients summed once") {
    const StepCost c = predict_step(plan_of({"parallel.tp=2", "parallel.sequence_parallel=true"}), hw);
    // Per layer: qkv and fc gather forward, re-gather and reduce-scatter backward; the two row
    // linears reduce-scatter forward and gather backward. Embedding: reduce-scatter, gather back.
    // Head: as a column linear. Partial gradients: ln1, ln2 (weight, bias), 2 row biases per
    // layer; ln_f's weight and bias: 14 of C floats.
    const double per_layer = 2 * (ag(act) + ag(act) + rs(act)) + 2 * (rs(act) + ag(act));
    const double expect = kLayers * per_layer + (rs(act) + ag(act)) + (2 * ag(act) + rs(act)) + loss_and_norm + 14 * ar(4 * C);
    CHECK(c.comm_total.at("tp") == doctest::Approx(expect).epsilon(1e-9));
  }
  SUBCASE("recomputed row linears all-reduce again") {
    const StepCost none = predict_step(plan_of({"parallel.tp=2"}), hw);
    const StepCost full = predict_step(plan_of({"parallel.tp=2", "recompute.mode=full"}), hw);
    CHECK(full.comm_total.at("tp") == doctest::Approx(none.comm_total.at("tp") + kLayers * 2 * ar(act)).epsilon(1e-9));
  }
}

TEST_CASE("data parallel: buckets hidden behind the backward, the rest exposed") {
  HardwareProfile hw = hand_profile();
  const Plan one = plan_of({"parallel.dp=2", "batch.global=4", "parallel.bucket_mb=1000"});
  REQUIRE(one.dp == 2);
  double params = 0;
  for (const ops::TensorDesc& d : one.layout->rank_params(0, 0)) params += static_cast<double>(ops::numel_of(d.shape));
  auto ar = [&](double bytes, bool inter) { return hw.collective_seconds(Collective::all_reduce, 2, bytes, inter); };
  const double small = ar(8, false) + ar(16, false);  // the token count and the gradient norm
  SUBCASE("one bucket: ready only when the backward ends, all of it exposed") {
    const StepCost c = predict_step(one, hw);
    const double padded = std::ceil(params / 2) * 2;
    CHECK(c.comm_exposed.at("dp") == doctest::Approx(ar(4 * padded, false) + small).epsilon(1e-9));
    CHECK(c.comm_total.at("dp") == doctest::Approx(c.comm_exposed.at("dp")).epsilon(1e-12));
    CHECK(c.step_s == doctest::Approx(sum_breakdown(c)).epsilon(1e-12));
    SUBCASE("across nodes costs more, at the inter-node link's price") {
      hw.nodes = 2;  // one rank per node
      const StepCost x = predict_step(one, hw);
      CHECK(x.comm_exposed.at("dp") == doctest::Approx(ar(4 * padded, true) + ar(8, true) + ar(16, true)).epsilon(1e-9));
      CHECK(x.comm_exposed.at("dp") > c.comm_exposed.at("dp"));
      CHECK(x.step_s > c.step_s);
    }
  }
  SUBCASE("a bucket per parameter behind a long backward: only the embedding's, ready at its end") {
    // Buckets close at 1 byte: one per parameter. The layers' buckets finish long before the
    // embedding's backward ends; wpe and wte (read by the first node) are ready only then.
    const StepCost c = predict_step(plan_of({"parallel.dp=2", "batch.global=4", "parallel.bucket_mb=0.000001"}), hw);
    const double exposed = ar(4 * 16 * 32, false) + ar(4 * 64 * 32, false) + small;
    CHECK(c.comm_exposed.at("dp") == doctest::Approx(exposed).epsilon(1e-9));
    CHECK(c.comm_total.at("dp") > 2 * c.comm_exposed.at("dp"));
  }
  SUBCASE("ZeRO-1: reduce-scatter, then the updated parameters all-gathered after the optimizer") {
    const StepCost c = predict_step(plan_of({"parallel.dp=2", "batch.global=4", "parallel.bucket_mb=1000", "parallel.zero=1"}), hw);
    const double padded = std::ceil(params / 2) * 2;
    const double rs = hw.collective_seconds(Collective::reduce_scatter, 2, 4 * padded, false);
    const double ag = hw.collective_seconds(Collective::all_gather, 2, 4 * padded, false);
    CHECK(c.comm_exposed.at("dp") == doctest::Approx(rs + ag + small).epsilon(1e-9));
    CHECK(c.optimizer < predict_step(one, hw).optimizer);  // half the parameters' update
  }
}

TEST_CASE("ranks sharing a CPU node: their own threads' rate, time-sliced past the node's cores") {
  const HardwareProfile hw = hand_profile();  // 4 cores
  // dp2, one thread each: each rank computes one micro-batch as one rank alone would.
  const double alone = predict_step(plan_of({}), hw).compute;
  CHECK(predict_step(plan_of({"parallel.dp=2", "batch.global=4"}), hw).compute == doctest::Approx(alone).epsilon(1e-9));
  // Two ranks of 4 threads on 4 cores: each op takes twice its 4-thread time.
  const double four = predict_step(plan_of({"train.threads=4"}), hw).compute;
  const StepCost over = predict_step(plan_of({"parallel.dp=2", "batch.global=4", "train.threads=4"}), hw);
  CHECK(over.compute == doctest::Approx(2 * four).epsilon(1e-9));
  CHECK(over.threads == 4);
}

TEST_CASE("threads per rank and the placement of the groups") {
  HardwareProfile hw = hand_profile();
  CHECK(threads_per_rank(plan_of({}), hw) == 1);  // train.threads
  const char* env = std::getenv("OMP_NUM_THREADS");
  const std::string saved = env ? env : "";
  unsetenv("OMP_NUM_THREADS");
  CHECK(threads_per_rank(plan_of({"train.threads=0"}), hw) == 4);                    // the node's cores
  CHECK(threads_per_rank(plan_of({"train.threads=0", "parallel.dp=2", "batch.global=4"}), hw) == 2);  // shared by 2 ranks
  hw.nodes = 2;
  CHECK(threads_per_rank(plan_of({"train.threads=0", "parallel.dp=2", "batch.global=4"}), hw) == 4);  // one rank per node
  if (env) setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  // A GPU: no threads; tp inside the node is cheaper than across nodes.
  HardwareProfile gpu = hand_profile();
  gpu.device = "h100-80gb";
  gpu.devices_per_node = 2;
  gpu.nodes = 2;
  const Plan inside = plan_of({"hardware.device=h100-80gb", "parallel.tp=2", "parallel.dp=2", "batch.global=4"});
  CHECK(threads_per_rank(inside, gpu) == 0);
  gpu.devices_per_node = 1;
  gpu.nodes = 4;
  const StepCost across = predict_step(inside, gpu);
  gpu.devices_per_node = 2;
  gpu.nodes = 2;
  const StepCost in = predict_step(inside, gpu);
  CHECK(across.comm_exposed.at("tp") > in.comm_exposed.at("tp"));
  // tp fastest in the rank order: with 2 devices per node the tp pairs stay inside, dp crosses.
  gpu.devices_per_node = 4;
  gpu.nodes = 1;
  CHECK(in.comm_exposed.at("dp") > predict_step(inside, gpu).comm_exposed.at("dp"));
}

TEST_CASE("the optimizer step: AdamW, the gradient norm and zeroing, by bytes") {
  const HardwareProfile hw = hand_profile();
  const Plan p = plan_of({});
  double params = 0;
  for (const ops::TensorDesc& d : p.layout->rank_params(0, 0)) params += static_cast<double>(ops::numel_of(d.shape));
  // fp32 AdamW: gradient, m, v read, m, v, weight read and written: 28 bytes an element; the
  // gradient norm reads the gradients (4), zeroing writes them (4); all at the memory bandwidth.
  const StepCost c = predict_step(p, hw);
  CHECK(c.optimizer == doctest::Approx((28 + 4 + 4) * params / hw.compute[0].memory_bandwidth).epsilon(1e-9));
  // bf16 with fp32 masters and fp32 gradients: 4 + 16 + 8 + 2 bytes an element for AdamW.
  const StepCost b = predict_step(plan_of({"precision.compute=bf16"}), hw);
  CHECK(b.optimizer == doctest::Approx((30 + 4 + 4) * params / hw.compute[0].memory_bandwidth).epsilon(1e-9));
  // The zeros are written inside AdamW's pass (Backend::adamw_update_zero_grad):
  // per parameter tensor two calls (the norm's, the fused update), not a third zeroing pass.
  HardwareProfile slow = hw;
  for (ComputeProfile& k : slow.compute) k.launch_s = 1e-3;
  const double tensors = static_cast<double>(p.layout->rank_params(0, 0).size());
  CHECK(predict_step(p, slow).optimizer - c.optimizer == doctest::Approx(2 * tensors * 1e-3).epsilon(1e-9));
}

TEST_CASE("to_json carries every field of the prediction") {
  const StepCost c = predict_step(plan_of({"parallel.tp=2"}), hand_profile());
  const nlohmann::json j = c.to_json();
  for (const char* k : {"step_s", "tokens_per_s", "mfu", "tflops_per_device", "threads"}) CHECK(j.contains(k));
  for (const char* k : {"compute", "recompute", "bubble", "optimizer", "data", "comm_total", "comm_exposed"})
    CHECK(j.at("breakdown").contains(k));
  CHECK(j.at("step_s").get<double>() == doctest::Approx(c.step_s));
  CHECK(j.at("breakdown").at("comm_exposed").at("tp").get<double>() == doctest::Approx(c.comm_exposed.at("tp")));
}

// ZeRO-2: ZeRO-1's reduce-scatter after every micro-batch's backward (the shard cannot hold
// an unsharded sum), the all-gather once. ZeRO-3: no all-gather after the optimizer; every
// gather unit all-gathered before its forward and again before its backward, per micro-batch,
// behind the previous unit's compute. The tiny model's units (tied embedding, GPT-2 layers):
// before the layers wte + wpe, 64 x 32 + 16 x 32 = 2560; a layer 2C + 3C^2 + 3C + C^2 + C + 2C
// + HC + H + CH + C = 12704; after them ln_f, 2C = 64.
TEST_CASE("ZeRO-2 and ZeRO-3: reduce-scatter per micro-batch; ZeRO-3's gathers per layer, hidden behind compute") {
  HardwareProfile hw = hand_profile();
  auto rs = [&](double bytes) { return hw.collective_seconds(Collective::reduce_scatter, 2, bytes, false); };
  auto ag = [&](double bytes) { return hw.collective_seconds(Collective::all_gather, 2, bytes, false); };
  const double small = hw.collective_seconds(Collective::all_reduce, 2, 8, false) +
                       hw.collective_seconds(Collective::all_reduce, 2, 16, false);
  auto plan = [&](int zero, int64_t layers, std::vector<std::string> more = {}) {
    std::vector<std::string> sets = {"parallel.dp=2", "batch.global=8", "parallel.bucket_mb=1000",
                                     "parallel.zero=" + std::to_string(zero), "model.n_layers=" + std::to_string(layers)};
    sets.insert(sets.end(), more.begin(), more.end());
    return plan_of(sets);
  };
  const double layer = 12704, before = 2560, after = 64;
  const Plan two = plan(2, 2);
  REQUIRE(two.accum == 2);
  REQUIRE(static_cast<double>(two.param_count) == before + 2 * layer + after);
  const double padded = std::ceil(static_cast<double>(two.param_count) / 2) * 2;
  SUBCASE("ZeRO-2: twice ZeRO-1's reduce-scatter at accum 2, one all-gather") {
    const StepCost c = predict_step(two, hw);
    CHECK(c.comm_total.at("dp") == doctest::Approx(2 * rs(4 * padded) + ag(4 * padded) + small).epsilon(1e-9));
    CHECK(c.comm_exposed.at("dp") == doctest::Approx(2 * rs(4 * padded) + ag(4 * padded) + small).epsilon(1e-9));
    const StepCost one = predict_step(plan(1, 2), hw);
    CHECK(one.comm_total.at("dp") == doctest::Approx(rs(4 * padded) + ag(4 * padded) + small).epsilon(1e-9));
  }
  SUBCASE("ZeRO-3: per micro-batch each unit gathered twice; the total grows with the layers") {
    auto gathers = [&](int64_t layers) {
      return ag(4 * before) + static_cast<double>(layers) * ag(4 * layer) + ag(4 * after);
    };
    for (int64_t layers : {2, 4}) {
      INFO(layers << " layers");
      const Plan p = plan(3, layers);
      const double pad = std::ceil(static_cast<double>(p.param_count) / 2) * 2;
      const StepCost c = predict_step(p, hw);
      CHECK(c.comm_total.at("dp") == doctest::Approx(2 * (2 * gathers(layers) + rs(4 * pad)) + small).epsilon(1e-9));
      // Kept from forward to backward: one gather per unit.
      const StepCost keep = predict_step(plan(3, layers, {"parallel.reshard_after_forward=false"}), hw);
      CHECK(keep.comm_total.at("dp") == doctest::Approx(2 * (gathers(layers) + rs(4 * pad)) + small).epsilon(1e-9));
    }
    CHECK(predict_step(plan(3, 4), hw).comm_total.at("dp") > predict_step(plan(3, 2), hw).comm_total.at("dp"));
  }
  SUBCASE("ZeRO-3 with compute dominating: only the gathers nothing computes before are exposed") {
    // GEMMs a million times slower: every layer's compute outlasts any gather. Exposed per pass
    // is the first unit's gather and the one after a unit with no compute of its own (the
    // embedding before layer 0 in the forward, ln_f before the last layer in the backward):
    // the same for 2 layers and for 4.
    for (ComputeProfile& c : hw.compute) c.gemm["fp32"][0].flops_per_s *= 1e-6;
    for (int64_t layers : {2, 4}) {
      INFO(layers << " layers");
      const Plan p = plan(3, layers);
      const double pad = std::ceil(static_cast<double>(p.param_count) / 2) * 2;
      const StepCost c = predict_step(p, hw);
      const double exposed = ag(4 * before) + ag(4 * layer) + ag(4 * after) + ag(4 * layer);
      CHECK(c.comm_exposed.at("dp") == doctest::Approx(2 * (exposed + rs(4 * pad)) + small).epsilon(1e-9));
    }
  }
}
