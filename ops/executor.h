// The graph executor: forward, backward and recompute of one micro-batch over a Backend.
//
// Memory follows the graph's liveness exactly: a forward output lives in the activations
// account if some backward reads it (TensorDesc::saved) and in the workspace account
// otherwise, and is released at its last forward use; recompute segments release their
// internals when the segment ends and rebuild them just before their backward. The same
// code path runs in dry-run mode (no kernels, no storage, bytes counted), which is how the
// plan's ledger predicts each account: prediction and measurement share one schedule.
// What a node computes is its kind's OpDef (ops/ops.h); the executor has no per-kind code.
//
// Precision (bf16 / fp16 compute): tensors are stored in their graph dtype, and every OpDef
// computes in fp32. Around each call the executor widens the node's 16-bit operands into fp32
// workspace copies (inputs, saved outputs, the output gradient), hands the kernel fp32 output
// buffers and rounds them into 16-bit storage afterwards (round to nearest even; fp16
// overflows to inf and underflows through subnormals to zero). So each operator reads 16-bit
// values, accumulates in fp32 and stores 16 bits, as mixed-precision hardware does. Gradients
// follow the same rule: an activation's gradient is stored in its dtype (a tensor read twice
// sums in fp32 and is rounded again; this is where fp16 underflows without loss scaling), and a
// 16-bit parameter's gradient, computed in fp32, goes into the bound gradient buffer in that
// buffer's dtype (TensorDesc::grad_dtype): accumulated straight into an fp32 buffer by the
// kernel (grad_accum fp32, the default: a fused fp32 weight-gradient accumulation, no copy),
// or through an fp32 copy rounded once per addition into a 16-bit one. The
// fp32 copies are workspace, counted by the dry run at the moment the real run holds them.
// One exception: an OpDef whose reads16 says so reads its 16-bit operands as stored (the Linear
// when ops/gemm_path.h chose oneDNN's 16-bit matmul for the dtype); then no copies of its
// inputs, outputs or output gradient are made or counted. Its fp32 outputs and input gradients
// are handled as above.
// A second exception: an OpDef with native16 (the memory-bound operators) whose
// node qualifies (Impl::native16_call: the switch ops::set_native16 / RUNNER_NATIVE16, a
// backend with the kernels, no tensor or sequence parallelism) gets its 16-bit activations,
// outputs and activation gradients as stored; its kernels convert tile by tile with the same
// results bit for bit, so only the copies disappear (and from the dry run's count with them).
//
// Host and device (docs/invariants.md invariant 7): the widening, rounding and
// accumulation above are backend kernels (Backend::convert, Backend::accumulate), queued with the
// operators, so the executor never touches tensor memory itself. It crosses to the host at two
// named points: the batch in (tokens, targets: Tensor::write_from_host) and the per-position
// losses out (read_to_host, which waits for the forward), summed on the host in position order.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/graph.h"
#include "ops/group.h"
#include "ops/kv_cache.h"
#include "ops/tensor.h"

namespace ops {

struct MemoryEstimate {
  std::array<size_t, kAccounts> peak{};  // peak bytes per account during one forward+backward
  size_t peak_total = 0;                 // peak of the sum (accounts peak at different moments)
  size_t activations_after_forward = 0;  // bytes held for backward when forward ends
};

struct OpProfile {
  std::string name;       // op kind
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0;
  int64_t calls = 0;
};

// One timed node execution, for trace files: which node of which graph, the pass ('f'
// forward, 'b' backward, 'r' recompute) and its steady-clock start and end (ns).
struct TraceEvent {
  const Graph* graph;
  int node;
  char pass;
  int64_t t0_ns, t1_ns;
};

class Executor {
 public:
  Executor(const Graph& g, Backend& be);
  ~Executor();

  // Binds a parameter's value and gradient (shapes must match the graph).
  void bind_param(int tensor_id, Tensor* value, Tensor* grad);

  struct LossSum {
    double sum = 0;      // sum of per-position losses over targets >= 0
    int64_t count = 0;   // number of positions with targets >= 0
  };
  // One micro-batch forward. train=false keeps nothing for backward. `sample_offset` is the
  // index of this micro-batch's first sample in the global batch and `key` the step's dropout
  // key: masks are a function of (key, site, global element index), never of the layout.
  // Pipeline stages: `stage_in` is the activation received from the previous stage (graphs with
  // a stage_input), copied in; `stage_out` receives this stage's output (graphs with a
  // stage_output) for sending on.
  // Where the memory is: tokens and targets are HOST memory (the data loader's batch:
  // the executor copies them in, and sums the losses it copies out against `targets`); the
  // stage buffers are the backend's memory (device-to-device copies), like every tensor.
  LossSum forward(const int32_t* tokens, const int32_t* targets, bool train, uint64_t key = 0,
                  int64_t sample_offset = 0, const void* stage_in = nullptr, void* stage_out = nullptr);
  // Backward of the last training forward; dloss is d(total loss)/d(each position's loss).
  // Parameter gradients accumulate into the bound grad tensors. Pipeline stages: `dstage_out`
  // is the gradient of the stage output received from the next stage; `dstage_in` receives the
  // gradient of the stage input, to send to the previous stage.
  // The stage buffers hold the stage tensor's own dtype (16 bits under bf16/fp16 compute).
  void backward(float dloss, const void* dstage_out = nullptr, void* dstage_in = nullptr);

  // Tensor parallelism: the group that the graph's TpMode nodes reduce over (must outlive the
  // executor's use). Required when the graph has tensor-parallel nodes.
  void set_group(ReduceGroup* group);
  // Called with node i after node i's backward (and any recompute before it) finished, in
  // reverse node order: a parameter's gradient is complete for this micro-batch once the hook
  // has run for the first node (in forward order) that reads it. Data parallelism launches
  // gradient all-reduces from here. Empty: no hook.
  void set_grad_hook(std::function<void(int)> hook);
  // Forward up to the logits only (inference); returns (B*T, V) logits valid until the next call,
  // in the backend's memory (read them with Tensor::read_to_host). tokens: host memory.
  // A pipeline's last stage passes its received activation as stage_in (tokens may be null).
  const Tensor& forward_logits(const int32_t* tokens, const void* stage_in = nullptr);

  // Generation: the KV cache the graph's Attention nodes use (must outlive the executor's
  // use; null: none). A prefill graph stores each layer's K and V into it as it attends; a
  // decode graph (Graph::decode) attends over it at the positions in cache->pos.
  void set_kv_cache(KvCache* cache);

  // Dry run of forward+backward (train) counting bytes per account, no kernels executed.
  static MemoryEstimate simulate(const Graph& g);

  std::vector<OpProfile> profile() const;
  void reset_profile();
  // Appends a TraceEvent per node executed (forward, backward, recompute) to `sink` while it
  // is set; null (the default) records nothing.
  void set_trace(std::vector<TraceEvent>* sink);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace ops
