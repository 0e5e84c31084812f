// The per-rank memory ledger: four accounts (parameters, gradients, optimizer states,
// activations) plus workspace and communication buffers, per pipeline stage.
//
// The activation side is a dry run of the executor over the layout's graphs
// (ops::Executor::simulate: the same allocation schedule the trainer runs, so prediction and
// measurement agree byte for byte), replayed over the stage's pipeline schedule: each forward
// holds its chunk's activations until that micro-batch's backward, and a backward adds its
// recompute transient. The schedule is Plan::schedule, the one the trainer runs.
#include <algorithm>

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

// A pipeline stage's buffers for one model chunk, as the trainer allocates them: per
// micro-batch in flight, the activation received and the gradient sent back (chunks after the
// first) and the activation sent (chunks before the last), plus one received gradient.
double pipeline_buffers(int vstage, int vstages, double in_flight, double message_bytes) {
  double b = 0;
  if (vstage > 0) b += 2.0 * in_flight * message_bytes;
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

}  // namespace

void compute_ledger(const Recipe& r, Plan& p) {
  const PrecisionConfig& pr = r.precision;
  size_t wbytes = dtype_bytes(to_string(pr.compute));
  size_t gbytes = pr.compute == FloatFormat::fp32 ? 4 : dtype_bytes(to_string(pr.grad_accum));
  bool master = pr.compute != FloatFormat::fp32 && pr.master_weights == MasterWeights::fp32;
  double opt_per_param = 8.0 + (master ? 4.0 : 0.0);
  int64_t zero_div = r.parallel.zero >= 1 ? p.dp : 1;
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
    L.parameters = static_cast<double>(L.params) * wbytes;
    L.gradients = static_cast<double>(L.params) * gbytes;
    L.optimizer = static_cast<double>(L.params) * opt_per_param / static_cast<double>(zero_div);
    // Host copies of the state: the asynchronous checkpoint's snapshot buffers and the
    // in-memory rollback snapshot each hold the parameters and the optimizer states. They
    // live in host memory, which is the device's memory only when the device is the CPU.
    if (device_kind(r.hardware).host) {
      double state_copy = static_cast<double>(L.params) * 4.0 + L.optimizer;
      if (r.checkpoint.async) L.workspace += state_copy;
      if (r.checkpoint.snapshot_every > 0) L.workspace += state_copy;
    }
    // The GPU backend's own buffers (cuBLASLt's workspace, scratch, the widened bias), held
    // from its start; its tensors' workspace is the dry run's, under cuBLASLt's GEMM paths.
    if (device_kind(r.hardware).gpu) L.workspace += static_cast<double>(ops::cuda::kFixedWorkspaceBytes);
    // Communication buffers besides the pipeline's: data-parallel buckets are reduced in place
    // in the flat gradient buffer (no copy), except under ZeRO-1, where each rank receives its
    // reduced piece of every bucket (params / dp elements); tensor-parallel all-reduces are in place.
    if (p.dp > 1 && r.parallel.zero >= 1) L.communication += static_cast<double>(L.params) * gbytes / static_cast<double>(p.dp);
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
