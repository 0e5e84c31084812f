// One operator, one place. Each OpKind is an OpDef: its forward, its backward, which of its
// tensors the backward reads (Node::saves) and the workspace scratch it allocates, defined
// side by side in the file of its family:
//   op_embedding.cpp  Embedding (vocabulary-parallel)
//   op_norm.cpp       LayerNorm, RMSNorm
//   op_linear.cpp     Linear (column / row parallel, sequence-parallel gather / scatter)
//   op_attention.cpp  Rope, Attention
//   op_pointwise.cpp  Gelu, SwiGLU, Add, Dropout, Relu2
//   op_loss.cpp       SoftmaxXent (vocabulary-parallel)
//   op_fused.cpp      LinearGelu (Linear + bias + GELU in one node, fp32, no sequence parallelism),
//                     AddLayerNorm, AddRMSNorm (a residual Add and the norm of its sum in one node)
// and gathered in kOpTable below, indexed by OpKind, which Graph::add_node (saves) and the
// Executor (everything else) consult. Neither has a per-kind switch.
//
// Division of labour: the executor owns memory and order. It allocates a node's outputs and
// its inputs' gradient buffers, counts scratch in the dry run, times the call and releases
// what is dead; the OpDef only runs its kernels, and its kind's tensor-parallel collectives
// (over ops::ReduceGroup), on the pointers it is handed in an OpContext. Dispatch is one
// indirect call per node; no kernel's inner loop sees it.
//
// Adding an operator: an entry in graph.h's OPS_OP_KINDS, its OpDef in its family's file
// (named kKindOp: the declaration and the table row below are expanded from the list) with
// the kernels it runs (OpDef::kernels) and its figures (FLOPs, GEMMs, bytes moved, the
// calibration probe: what the planner, the cost model and `runner calibrate` read instead of
// switching on the kind), its kernels (ops/kernels.h, cpu/, cuda/), and cases in its family's test table
// (tests/test_ops_*.cpp) and one in tests/test_ops_table.cpp, which runs every OpDef through
// the executor and fails for a kind without a case. docs/architecture.md has the checklist.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/check.h"
#include "ops/graph.h"
#include "ops/group.h"
#include "ops/kv_cache.h"
#include "ops/rng.h"
#include "ops/tensor.h"

namespace ops {

// Inputs and outputs per node that an OpContext carries (LayerNorm has 3 of each);
// Graph::add_node refuses a node with more.
constexpr int kMaxOperands = 4;

// What one call of an OpDef's forward or backward sees of the executor. Pointers are this
// rank's buffers for one micro-batch (null in positions the node does not have).
struct OpContext {
  const Graph& g;
  const Node& n;
  Backend& be;
  ReduceGroup* group = nullptr;  // tensor-parallel group; null without tensor parallelism
  bool train = false;
  uint64_t key = 0;              // the step's dropout key
  int64_t sample_offset = 0;     // index of this micro-batch's first sample in the global batch
  KvCache* kv = nullptr;         // generation's KV cache (Executor::set_kv_cache); null otherwise
  std::vector<float>* host = nullptr;  // a reusable host buffer outside the ledger (row statistics)
  std::array<void*, kMaxOperands> ins{}, outs{};  // values by position (forward outputs: the
                                                  // buffers to write; null for a non-fp32 one)
  // Backward only.
  std::array<float*, kMaxOperands> dins{};  // gradient buffers of the inputs, to accumulate into
                                            // (null: not needed, or an input or int tensor)
  const float* dout = nullptr;   // gradient of out[0] (null for a kind that seeds the backward)
  float dloss = 0.0f;            // d(total loss)/d(each position's loss)
  float* dout_own = nullptr;     // dout, writable: set only for OpDef::consumes_dout
  const float* dout1 = nullptr;  // gradient of out[1]: set only for OpDef::reads_dout1
  // The call reads its operands as stored (OpDef::reads16 said so): ins, the backward's outs
  // and dout point at the tensors' own dtype (16 bits), not at fp32 copies. Forward outputs
  // and input gradients are fp32 buffers as always.
  bool as_stored = false;
  // The call runs the op's 16-bit-native kernels (OpDef::native16; the
  // executor's choice, Executor native16_call): the activations, the forward's 16-bit outputs
  // and the activations' gradients (dins, as void*) are the tensors' own 16-bit buffers, of
  // dtype16(); parameters and fp32 tensors (norm statistics) are as on the widened path.
  bool native16 = false;
  DType dtype16() const { return g.tensors[n.out[0]].dtype; }

  const TensorDesc& in_desc(int j) const { return g.tensors[n.in[j]]; }
  const TensorDesc& out_desc(int j) const { return g.tensors[n.out[j]]; }
  float* in(int j) const { return static_cast<float*>(ins[j]); }
  const int32_t* in_i32(int j) const { return static_cast<const int32_t*>(ins[j]); }
  float* out(int j) const { return static_cast<float*>(outs[j]); }
  float* din(int j) const { return dins[j]; }

  int B() const { return static_cast<int>(g.B); }
  int T() const { return static_cast<int>(g.T); }
  int tp_rank() const { return group ? group->rank() : 0; }
  // All-reduce (sum) over the tensor-parallel group; nothing on one rank.
  void allreduce(float* x, int64_t count) const {
    if (group && group->size() > 1) group->allreduce_sum(x, count);
  }
  // The node's dropout for `per_sample` mask elements per sample: masks are a function of
  // (step key, site, global element index), never of the layout (p is 0 outside training).
  DropoutSpec dropout(int64_t per_sample) const {
    DropoutSpec d;
    d.p = train ? n.dropout : 0.0f;
    d.key = rng_key(key, n.site);
    d.offset = static_cast<uint64_t>(sample_offset * per_sample);
    return d;
  }
};

// The heads of a Rope or Attention node, as its kernels take them.
inline Heads heads_of(const Node& n) {
  return Heads(n.heads, n.kv_heads > 0 ? n.kv_heads : n.heads, n.kv_group, n.kv_first);
}

// Rows of a tensor seen as (rows, last dimension).
inline int64_t rows_of(const TensorDesc& d) { return numel_of(d.shape) / d.shape.back(); }

// An fp32 temporary in the workspace account (sequence parallelism's full-sequence buffers).
// Every byte an OpDef allocates this way must be reported by its `scratch` at the same call,
// so that the dry run counts it (docs/invariants.md, invariant 4).
inline Tensor scratch_tensor(std::vector<int64_t> shape, bool zero) {
  return zero ? Tensor::zeros(std::move(shape), DType::F32, Account::Workspace)
              : Tensor::empty(std::move(shape), DType::F32, Account::Workspace);
}

// ---- Figures: what the planner, the cost model and `runner calibrate` know of a kind ----
// Each OpDef states them beside its kernels (OpDef::flops, gemms, attention, traffic,
// collectives, residual_outputs, probe), so that runner/perf/cost.cpp, runner/plan/recompute.cpp
// and runner/perf/calibrate.cpp price and measure every kind from its OpDef alone.

// One GEMM: (m x k) times (k x n), 2mnk FLOPs.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};
// The GEMMs of one call (a Linear's backward runs two: d(input) and d(weight)).
struct OpGemms {
  std::array<GemmShape, 2> shapes{};
  int count = 0;
};

// Causal attention's work as the hardware profile's attention rate takes it.
struct AttentionShape {
  int64_t batch_heads = 0, seq = 0, head_dim = 0;
};

// Bytes one forward and one backward call move through memory (reads + writes), priced at the
// calibrated bandwidth of `kind` (a name in the profile's op_bandwidth: the kind whose probe
// measured it; a missing one falls back to the memory bandwidth). A part with no kind is a
// call whose time is not its bytes (a bare GEMM, attention): only its launch is priced.
struct OpTraffic {
  const char* kind = nullptr;
  double forward = 0, backward = 0;
};
// The memory-bound parts of one node (a fused node: those of the kinds it replaces).
struct OpTrafficParts {
  std::array<OpTraffic, 3> parts{};
  int count = 0;
};

// The tensor-parallel collectives one call makes over its ops::ReduceGroup (fp32 buffers), which
// the cost model prices at the profile's link rates. Bytes are the whole buffer's.
enum class TpCollective : uint8_t { all_reduce, all_gather, reduce_scatter };
struct OpCollective {
  TpCollective op = TpCollective::all_reduce;
  double bytes = 0;
  bool backward = false;  // made by the backward call (else the forward)
};
struct OpCollectives {
  std::array<OpCollective, 6> calls{};
  int count = 0;
  void add(TpCollective op, double bytes, bool backward) {
    OPS_CHECK(count < static_cast<int>(calls.size()), "OpCollectives: more calls than it holds");
    calls[static_cast<size_t>(count++)] = {op, bytes, backward};
  }
};

// A calibration probe's one-node graph (runner calibrate implements it): `rows` rows of the
// float input x, parameters, the token ids or targets, and the outputs (the first one leaves the
// graph: the stage output, or the losses of a kind that seeds_backward).
struct ProbeBuilder {
  virtual ~ProbeBuilder() = default;
  virtual void x(std::vector<int64_t> shape) = 0;
  virtual void param(const std::string& name, std::vector<int64_t> shape) = 0;
  virtual void tokens() = 0;   // (1, rows) int32
  virtual void targets() = 0;  // (1, rows) int32
  virtual void out(const std::string& name, std::vector<int64_t> shape, bool f32) = 0;
  virtual Node& node() = 0;    // the node itself, for its attributes (eps, ...)
};

// The kernels of one call (OpDef::kernels), in the order it runs them.
struct OpKernels {
  std::array<Kernel, 4> list{};
  int count = 0;
  OpKernels() = default;
  OpKernels(std::initializer_list<Kernel> ks) {
    for (Kernel k : ks) add(k);
  }
  void add(Kernel k) {
    OPS_CHECK(count < static_cast<int>(list.size()), "OpKernels: more kernels than it holds");
    list[static_cast<size_t>(count++)] = k;
  }
  const Kernel* begin() const { return list.data(); }
  const Kernel* end() const { return list.data() + count; }
};
// OpDef::kernels of a kind that runs one kernel each way.
template <Kernel Fwd, Kernel Bwd>
OpKernels kernel_pair(const Graph&, const Node&, bool backward, bool) {
  return {backward ? Bwd : Fwd};
}

struct OpDef {
  OpKind kind;
  const char* name;  // the profiler's name of the kind
  // Tensor ids that the backward reads (empty: none), kept alive from the forward for it.
  // Parameters and inputs may appear; only activations count in the ledger.
  std::vector<int> (*saves)(const Node&);
  // Workspace bytes that one forward (backward = false) or backward call allocates and frees
  // again within the call, for the dry run. Null: none.
  size_t (*scratch)(const Graph&, const Node&, bool backward);
  // Writes the outputs from the inputs.
  void (*forward)(OpContext&);
  // Accumulates (+=) into c.dins from c.dout and the saved tensors (the loss overwrites:
  // seeds_backward).
  void (*backward)(OpContext&);
  // Whether this call (forward, or backward = true) reads its 16-bit operands as stored (the
  // Linear on oneDNN's 16-bit path, ops/gemm_path.h) instead of fp32 copies widened by the
  // executor. A function of the graph and the process's GEMM paths only, so the dry run and
  // the real run agree on which copies exist. Null: always widened.
  bool (*reads16)(const Graph&, const Node&, bool backward) = nullptr;
  // The loss: its backward needs no output gradient (it starts from dloss), and the gradient
  // of in[0] is written over in[0]'s own buffer (dlogits over the probabilities) instead of
  // being accumulated into a fresh zeroed one.
  bool seeds_backward = false;
  // The backward may overwrite the gradient of out[0] (OpContext::dout_own): the
  // executor hands it the buffer, which is dead after the call (it is released right after,
  // or is an fp32 copy made for the call), so a fused backward can turn d(out) into the
  // gradient of an inner value in place instead of allocating a second buffer of its size.
  bool consumes_dout = false;
  // The backward also reads the gradient of out[1] (OpContext::dout1): a node
  // whose two outputs both have readers downstream (AddNorm: the residual sum and its norm).
  // The executor runs its backward when either gradient is live and hands it both (a missing
  // one as a zeroed buffer), as the same dtype and layout as dout.
  bool reads_dout1 = false;
  // The kernels accept 16-bit activations as stored (the kernels' BF16/F16
  // entries): where the executor finds the call eligible (OpContext::native16) it neither widens
  // the activations nor rounds the outputs, and no fp32 copy of them exists.
  bool native16 = false;
  // The input positions (bit j: in[j]) where the native kernels take a parameter: a norm's
  // weight and bias, the embedding's tables. A node with a parameter elsewhere (an Add of a
  // parameter) is widened.
  uint8_t native16_params = 0;
  // Of those, the positions the native kernels read as stored (bit j: in[j], a subset of
  // native16_params): the executor hands the parameter's own 16-bit buffer (in the node's
  // activation dtype; a parameter of another dtype leaves the node widened), so neither the
  // real run nor the dry run makes an fp32 copy of it, forward or backward. The others are
  // widened into fp32 workspace copies per call, as on the widened path. For a large table
  // (the embedding's wte: GPT-2's is 147 MiB in fp32) the kernel gathers the rows it needs
  // instead; a norm's weight (C values) is cheap to widen and its kernels stay fp32.
  // Parameter gradients are unchanged: fp32 buffers accumulated directly, 16-bit ones through
  // the executor's widened fold.
  uint8_t native16_stored = 0;

  // The kernels one forward (backward = false) or backward call runs: their F32 entries, and
  // their BF16/F16 entries where the call is native16. A function of the node (its TpMode) and
  // the graph (decode), and of whether the call also writes a KV cache (prefill). The executor
  // checks them against its backend before any step (ops/kernel_check.h), and a backend's
  // 16-bit-native support is the 16-bit entries of every native16 kind's kernels. Required.
  OpKernels (*kernels)(const Graph&, const Node&, bool backward, bool kv_cache) = nullptr;

  // Figures (see above). FLOPs of one forward (backward = false) or backward call, multiply
  // and add counted as two: exact for the matrix products, a rough operation count per element
  // for pointwise work (exp, tanh and rsqrt as one). The recompute planner ranks its steps by
  // the forward figure (only ratios matter there); the cost model does not read FLOPs.
  double (*flops)(const Graph&, const Node&, bool backward) = nullptr;
  // The GEMMs one forward or backward call runs, priced by shape at the profile's GEMM rates.
  // Null: none.
  OpGemms (*gemms)(const Graph&, const Node&, bool backward) = nullptr;
  // Causal attention's shape, priced at the profile's attention rate. Null: none.
  AttentionShape (*attention)(const Graph&, const Node&) = nullptr;
  // The bytes it moves (cost model) in the units `runner calibrate` measured them in, so that
  // a node of the calibrated shape is priced at exactly its measured forward + backward time.
  OpTrafficParts (*traffic)(const Graph&, const Node&) = nullptr;
  // The tensor-parallel collectives it makes (in the order it makes them), as a function of the
  // node's TpMode and sequence-parallel flags: on one rank they cost nothing. Null: none.
  OpCollectives (*collectives)(const Graph&, const Node&) = nullptr;
  // The outputs (bit j: out[j]) that hold the residual stream's sum: the recompute planner's
  // accounting counts them under the residual add's module whatever the node's module (a fused
  // add + norm), so that its shares do not depend on model.fuse.
  uint8_t residual_outputs = 0;
  // Null, or the kind's bandwidth probe for `runner calibrate`: its one-node graph at (rows,
  // cols), whose measured forward + backward time over traffic's bytes is the kind's bandwidth
  // in the profile (op_bandwidth[name]).
  void (*probe)(ProbeBuilder&, int64_t rows, int64_t cols) = nullptr;
};

// The process's switch for OpDef::native16 (on unless the environment says
// RUNNER_NATIVE16=0): off, every operator takes the widened path. Set it before any executor
// runs or dry-runs (a dry run and a real run must see the same choice).
void set_native16(bool on);
bool native16_enabled();

// One per OpKind (kKindOp, graph.h's OPS_OP_KINDS), each defined in its family's file.
#define OPS_OP_DECLARE(K) extern const OpDef k##K##Op;
OPS_OP_KINDS(OPS_OP_DECLARE)
#undef OPS_OP_DECLARE

// The table, in OpKind order (a missing definition fails to link; tests/test_ops_table.cpp
// checks that each entry sits at its own kind's index).
#define OPS_OP_ROW(K) &k##K##Op,
inline constexpr std::array<const OpDef*, kOpKinds> kOpTable = {OPS_OP_KINDS(OPS_OP_ROW)};
#undef OPS_OP_ROW

constexpr bool every_kind_has_an_op() {
  for (const OpDef* op : kOpTable)
    if (op == nullptr) return false;
  return true;
}
static_assert(every_kind_has_an_op(), "kOpTable: an OpKind without an OpDef");

inline const OpDef& op_def(OpKind k) { return *kOpTable[static_cast<int>(k)]; }

// For OpDef::saves of a kind whose backward reads nothing.
inline std::vector<int> saves_nothing(const Node&) { return {}; }

// Figure helpers for the op files.
inline double numel_f(const Graph& g, int id) {
  return static_cast<double>(numel_of(g.tensors[static_cast<size_t>(id)].shape));
}
inline double dim_f(const Graph& g, int id, size_t k) {
  return static_cast<double>(g.tensors[static_cast<size_t>(id)].shape[k]);
}
inline double nbytes_f(const Graph& g, int id) { return static_cast<double>(g.tensors[static_cast<size_t>(id)].nbytes()); }
// One memory-bound part over `unit`'s bytes: `fwd` and `bwd` times them, at `kind`'s bandwidth.
inline OpTrafficParts traffic_of(const char* kind, double unit_bytes, double fwd, double bwd) {
  OpTrafficParts t;
  t.parts[0] = {kind, fwd * unit_bytes, bwd * unit_bytes};
  t.count = 1;
  return t;
}
// The parts of `a` followed by those of `b` (a fused node priced as the pair it replaces).
inline OpTrafficParts traffic_then(OpTrafficParts a, const OpTrafficParts& b) {
  OPS_CHECK(a.count + b.count <= static_cast<int>(a.parts.size()), "OpTrafficParts: more parts than it holds");
  for (int i = 0; i < b.count; ++i) a.parts[static_cast<size_t>(a.count++)] = b.parts[static_cast<size_t>(i)];
  return a;
}

}  // namespace ops
