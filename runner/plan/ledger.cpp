// The per-rank memory ledger: four accounts (parameters, gradients, optimizer states,
// activations) plus workspace and communication buffers, per pipeline stage.
//
// The activation side is a dry run of the executor over the layout's graphs
// (ops::Executor::simulate: the same allocation schedule the trainer runs, so prediction and
// measurement agree byte for byte), replayed over the stage's pipeline schedule: each forward
// holds its chunk's activations until that micro-batch's backward, and a backward adds its
// recompute transient. The schedule is Plan::schedule, the one the trainer runs.
#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "ops/cuda/cuda_workspace.h"
#include "ops/executor.h"
#include "runner/device/devices.h"
#include "runner/plan/plan_internal.h"

namespace runner::plan_detail {

namespace {

// Bytes of the activation a pipeline stage sends on (and of its gradient): one micro-batch's
// (B*T, C), or this rank's sequence shard of it under sequence parallelism.
double stage_message_bytes(const GptSpec& spec, size_t wbytes) {
  double b = static_cast<double>(spec.B * (spec.T ? spec.T : spec.model.seq_len) * spec.model.d_model) * wbytes;
  if (spec.sequence_parallel && spec.tp > 1) b /= static_cast<double>(spec.tp);
  return b;
}

// A pipeline stage's buffers for one model chunk, as the trainer allocates them
// (parallel::PipelineRunner): per micro-batch in flight, what it sends while the send is
// outstanding (the gradient back, chunks after the first; the activation on, chunks before the
// last), and one buffer for each thing it receives, which the executor copies in or reads at once.
double pipeline_buffers(int vstage, int vstages, double in_flight, double message_bytes) {
  double b = 0;
  if (vstage > 0) b += (in_flight + 1.0) * message_bytes;
  if (vstage < vstages - 1) b += (in_flight + 1.0) * message_bytes;
  return b;
}

// The activation side of stage `s`: its chunks' dry runs, and the activations of every
// (micro-batch, chunk) its schedule holds at once.
void stage_activations(const Plan& p, int s, size_t wbytes, StageLedger& L) {
  const ModelLayout& lay = *p.layout;
  const int P = lay.pp(), V = static_cast<int>(lay.chunks());
  const auto sched = p.schedule(s);
  std::vector<double> act(static_cast<size_t>(V)), transient(static_cast<size_t>(V));
  for (int c = 0; c < V; ++c) {
    const int vstage = c * P + s;
    ops::MemoryEstimate est = ops::Executor::simulate(lay.graph(vstage));
    act[static_cast<size_t>(c)] = static_cast<double>(est.activations_after_forward);
    transient[static_cast<size_t>(c)] =
        static_cast<double>(est.peak[static_cast<int>(ops::Account::Activations)]) - act[static_cast<size_t>(c)];
    L.workspace = std::max(L.workspace, static_cast<double>(est.peak[static_cast<int>(ops::Account::Workspace)]));
    L.communication += pipeline_buffers(vstage, P * V, parallel::max_in_flight(sched, c),
                                        stage_message_bytes(lay.spec(vstage), wbytes));
  }
  double cur = 0, peak = 0;
  int64_t live = 0, most = 0;
  for (const auto& a : sched) {
    const size_t c = static_cast<size_t>(a.chunk);
    if (a.forward) {
      cur += act[c];
      most = std::max(most, ++live);
      peak = std::max(peak, cur);
    } else {
      peak = std::max(peak, cur + transient[c]);
      cur -= act[c];
      --live;
    }
  }
  L.activations_per_micro = 0;
  for (double a : act) L.activations_per_micro += a;
  L.recompute_transient = *std::max_element(transient.begin(), transient.end());
  L.micro_in_flight = most;  // (micro-batch, chunk) pairs
  L.activations = peak;
}

// ZeRO-3's gather units of stage `stage` (tensor-parallel rank 0), in forward order, as element
// counts: each transformer layer's parameters together, and the parameters outside the layers
// that come together (before the layers: the embeddings; after them: the final norm and the
// head) as one unit each, as FSDP wraps them.
std::vector<int64_t> zero3_units(const ModelLayout& lay, int stage) {
  std::vector<int64_t> units;
  int last = -2;
  for (const ops::TensorDesc& d : lay.rank_params(stage, 0)) {
    if (d.layer == last) units.back() += ops::numel_of(d.shape);
    else units.push_back(ops::numel_of(d.shape));
    last = d.layer;
  }
  return units;
}

// The data-parallel gradient buckets of stage `stage` in elements, as parallel/grad_sync.cpp
// cuts them: whole parameters in reverse order until `cap` elements, padded to a multiple of
// dp; the tied embedding under pp is summed apart.
std::vector<int64_t> grad_bucket_elems(const ModelLayout& lay, int stage, double cap, int64_t dp) {
  std::vector<int64_t> out;
  const std::vector<ops::TensorDesc> shards = lay.rank_params(stage, 0);
  const std::vector<int>& idx = lay.stage_params(stage);
  int64_t len = 0;
  auto close = [&] {
    if (len > 0) out.push_back((len + dp - 1) / dp * dp);
    len = 0;
  };
  for (size_t k = shards.size(); k-- > 0;) {
    if (lay.params()[static_cast<size_t>(idx[k])].tied()) continue;  // summed apart (pp)
    len += ops::numel_of(shards[k].shape);
    if (static_cast<double>(len) >= cap) close();
  }
  close();
  return out;
}

// The sum of the `n` largest of `v`.
double largest(std::vector<int64_t> v, size_t n) {
  std::sort(v.begin(), v.end(), std::greater<>());
  double s = 0;
  for (size_t i = 0; i < std::min(n, v.size()); ++i) s += static_cast<double>(v[i]);
  return s;
}

// The data-parallel communication buffers of a rank of stage `s` under each ZeRO stage (the
// tensor-parallel all-reduces are in place; the pipeline's buffers are counted apart).
//  0: buckets are reduced in place in the flat gradient buffer: nothing.
//  1: each rank receives its reduced piece of every bucket: params / dp elements (gradient dtype).
//  2: the gradients exist only as this rank's shard (the gradient account); the backward writes
//     full-size gradients into a bucket, which is reduce-scattered into the shard while the
//     backward fills the next: the two largest buckets, as parallel/grad_sync.cpp cuts them
//     (bucket_mb, whole parameters in reverse order, padded to a multiple of dp), in full size.
//  3: the parameters too: the layer being computed and the next one prefetched, gathered in
//     full (the two largest gather units: a transformer layer, or the parameters before or
//     after the layers, such as the embedding or the head) in the compute dtype, or with
//     reshard_after_forward false every unit kept gathered from its forward to its backward
//     (the stage's whole weights); and the full-size gradients of the unit being
//     reduce-scattered (the largest unit, gradient dtype).
double dp_buffers(const Recipe& r, const Plan& p, int s, int64_t params, double wbytes, double gbytes) {
  if (p.dp <= 1 || r.parallel.zero == 0) return 0;
  const ModelLayout& lay = *p.layout;
  switch (r.parallel.zero) {
    case 1: return static_cast<double>(params) * gbytes / static_cast<double>(p.dp);
    case 2: {
      const double cap = std::max(1.0, r.parallel.bucket_mb * 1024.0 * 1024.0 / gbytes);
      return largest(grad_bucket_elems(lay, s, cap, p.dp), 2) * gbytes;
    }
    default: {
      const std::vector<int64_t> units = zero3_units(lay, s);
      const double gathered = r.parallel.reshard_after_forward ? largest(units, 2) : static_cast<double>(params);
      return gathered * wbytes + largest(units, 1) * gbytes;
    }
  }
}

}  // namespace

// ZeRO shards over the dp axis only: each account's divisor is dp where its stage shards it
// (1: optimizer states; 2: and gradients; 3: and parameters), applied to this rank's tensor-
// and pipeline-parallel shard of the model. A parameter held by two stages (the tied embedding
// under pp) is divided like every other.
void compute_ledger(const Recipe& r, Plan& p) {
  const PrecisionConfig& pr = r.precision;
  size_t wbytes = dtype_bytes(to_string(pr.compute));
  size_t gbytes = pr.compute == FloatFormat::fp32 ? 4 : dtype_bytes(to_string(pr.grad_accum));
  bool master = pr.compute != FloatFormat::fp32 && pr.master_weights == MasterWeights::fp32;
  double opt_per_param = 8.0 + (master ? 4.0 : 0.0);
  const int64_t z = r.parallel.zero;
  const double dp = static_cast<double>(p.dp);
  const double opt_div = z >= 1 ? dp : 1, grad_div = z >= 2 ? dp : 1, param_div = z >= 3 ? dp : 1;
  const ModelLayout& lay = *p.layout;
  p.stages.clear();
  int64_t first = 0;
  for (int64_t s = 0; s < p.pp; ++s) {
    StageLedger L;
    L.stage = static_cast<int>(s);
    L.first_layer = first;
    L.last_layer = first + p.stage_layers[static_cast<size_t>(s)];
    first = L.last_layer;
    for (const ops::TensorDesc& d : lay.rank_params(static_cast<int>(s), 0)) L.params += ops::numel_of(d.shape);
    stage_activations(p, static_cast<int>(s), wbytes, L);
    L.parameters = static_cast<double>(L.params) * wbytes / param_div;
    L.gradients = static_cast<double>(L.params) * gbytes / grad_div;
    L.optimizer = static_cast<double>(L.params) * opt_per_param / opt_div;
    // Host copies of the state: the asynchronous checkpoint's snapshot buffers and the
    // in-memory rollback snapshot each hold the parameters and the optimizer states. They
    // live in host memory, which is the device's memory only when the device is the CPU.
    if (device_kind(r.hardware).host) {
      double state_copy = static_cast<double>(L.params) * 4.0 / param_div + L.optimizer;
      if (r.checkpoint.async) L.workspace += state_copy;
      if (r.checkpoint.snapshot_every > 0) L.workspace += state_copy;
    }
    // The GPU backend's own buffers (cuBLASLt's workspace, scratch, the widened bias), held
    // from its start; its tensors' workspace is the dry run's, under cuBLASLt's GEMM paths.
    if (device_kind(r.hardware).gpu) L.workspace += static_cast<double>(ops::cuda::kFixedWorkspaceBytes);
    L.communication += dp_buffers(r, p, static_cast<int>(s), L.params, static_cast<double>(wbytes),
                                  static_cast<double>(gbytes));
    p.stages.push_back(L);
  }
}

// The KV cache of an inference batch beside the weights, on the worst stage.
void plan_inference(const Recipe& r, Plan& p) {
  if (!r.inference) return;
  const InferenceConfig& ic = *r.inference;
  InferencePlan ip;
  ip.batch = ic.batch;
  ip.context = ic.context ? ic.context : r.model.seq_len;
  ip.kv_dtype = to_string(ic.kv_dtype);
  for (auto& st : p.stages) {
    double layers = static_cast<double>(st.last_layer - st.first_layer);
    // K and V per layer and position: this rank's key-value heads (grouped-query attention:
    // n_kv_heads, split over tp or replicated) in the cache format, and for int8 one fp32
    // scale per head (ops/kv_cache.h; tests/test_generate_kv.cpp measures it).
    const double per_position = static_cast<double>(kv_cache_position_bytes(r.model, p.tp, ic.kv_dtype));
    double per_seq = layers * static_cast<double>(ip.context) * per_position;
    double weights = static_cast<double>(st.params) * dtype_bytes(r.precision.compute == FloatFormat::fp32 ? "fp32" : "bf16");
    if (weights + per_seq * ip.batch > ip.weights + ip.kv_cache) {
      ip.weights = weights;
      ip.kv_per_sequence = per_seq;
      ip.kv_cache = per_seq * static_cast<double>(ip.batch);
    }
  }
  double room = p.device_memory - ip.weights;
  ip.max_batch = room > 0 && ip.kv_per_sequence > 0 ? static_cast<int64_t>(room / ip.kv_per_sequence) : 0;
  if (ip.max_batch < ip.batch)
    p.warnings.push_back(fmt::format("inference: the KV cache for batch {} does not fit; at most batch {}", ip.batch,
                                     ip.max_batch));
  p.inference = ip;
}

}  // namespace runner::plan_detail
