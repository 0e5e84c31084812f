// The operator graph: one micro-batch's forward pass of one rank, as a list of nodes
// over named tensors with shapes and dtypes.
//
// It is built many times, per rank: runner/model expands the model family into a graph from
// a spec (the layers of one pipeline stage, or of one model chunk under the interleaved
// schedule; one tensor-parallel rank; the micro-batch size). The plan's model
// layout builds tensor-parallel rank 0's graph of every stage/chunk (the ledger dry-runs
// them, the parameter table reads their shapes), and each rank builds the graphs of its own
// stage's chunks for its own shard, which its executors run. All come out of the one builder
// from the same specs, so every reader sees the same structure (docs/invariants.md, invariant 1):
// the executor runs it, the ledger dry-runs the executor over it, recompute flags mark its
// nodes (by their ops::Module), the profiler names its nodes.
//
// Backward is implied: each node kind's OpDef (ops/ops.h) says which of its tensors its
// backward reads (Node::saves), and the executor walks the nodes in reverse.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/module.h"
#include "ops/tensor.h"

namespace ops {

// The operator kinds, in this order (X(Kind): its OpDef is kKindOp, ops/ops.h: its
// forward, backward, saves, scratch, kernels and figures). This list is the one place a kind
// is named: OpKind, the OpDef declarations and the op table are expanded from it. LinearGelu
// is Linear + Gelu fused (the MLP's fc and its activation, ops/op_fused.cpp); AddLayerNorm and
// AddRMSNorm are a residual Add and the norm that reads its sum; Relu2 is relu(x)^2
// (model.activation: relu2). A new kind goes last, so the earlier kinds keep their numbers.
#define OPS_OP_KINDS(X)                                                                                        \
  X(Embedding) X(LayerNorm) X(RMSNorm) X(Linear) X(Rope) X(Attention) X(Gelu) X(SwiGLU) X(Add) X(Dropout)     \
  X(SoftmaxXent) X(LinearGelu) X(AddLayerNorm) X(AddRMSNorm) X(Relu2)

#define OPS_OP_KIND_ENUM(K) K,
enum class OpKind : uint8_t { OPS_OP_KINDS(OPS_OP_KIND_ENUM) Count };
#undef OPS_OP_KIND_ENUM
constexpr int kOpKinds = static_cast<int>(OpKind::Count);
const char* op_name(OpKind k);
// The kind whose OpDef has this name ("relu2"); nullopt for none.
std::optional<OpKind> op_kind_named(std::string_view name);

enum class TensorKind : uint8_t { Param, Input, Activation };

// Tensor-parallel role of a node (Megatron-LM, Shoeybi et al. 2019). The kind's OpDef performs the
// collective over the executor's ops::ReduceGroup:
//   Column      Linear with a column-split weight: identity forward; all-reduce of d(input) in
//               backward (Megatron's "f").
//   Row         Linear with a row-split weight: all-reduce of the output in forward, the bias
//               added once (Megatron's "g"); identity backward.
//   VocabEmbed  Embedding over a vocabulary shard [vocab_start, +V/t): all-reduce of the output.
//   VocabXent   Cross-entropy over a vocabulary shard: max and sum all-reduces, never gathering
//               the logits.
enum class TpMode : uint8_t { None, Column, Row, VocabEmbed, VocabXent };

// How a parameter shard relates to its full logical tensor (tensor parallelism).
struct ShardSpec {
  int dim = -1;          // split dimension; -1: replicated
  int parts = 1;         // number of shards (tp size)
  int index = 0;         // this rank's shard
  int blocks = 1;        // the dim is `blocks` equal blocks each split separately (qkv: 3, swiglu fc: 2)
  // Unequal blocks: each block's full length along `dim` (grouped-query attention's qkv:
  // [q: NH*HS | k: NKV*HS | v: NKV*HS]); empty: `blocks` equal blocks.
  std::vector<int64_t> sizes;
  // Bit b set: block b is not split, every rank holds all of it (qkv's key-value blocks when
  // tp does not divide the key-value heads, as Megatron-LM replicates them). Such rows get a
  // partial gradient on each rank (only its query heads' share), summed over tp by the caller.
  uint32_t replicated = 0;

  bool split() const { return dim >= 0 && parts > 1; }
  // [shard, shard + len) of this shard's `dim` holds [full, full + len) of the full tensor's.
  struct Run {
    int64_t shard = 0, full = 0, len = 0;
    bool replicated = false;
  };
  // The runs along `dim` of a full length `full_len` (one identity run when not split).
  std::vector<Run> runs(int64_t full_len) const;
  int64_t shard_len(int64_t full_len) const;             // this shard's length along `dim`
  int64_t full_at(int64_t i, int64_t full_len) const;    // full index along `dim` of shard index i
};

struct TensorDesc {
  std::string name;             // params: "h.3.attn.qkv.weight"; activations: "h.3.attn.qkv.out"
  std::vector<int64_t> shape;   // this rank's shape for one micro-batch
  DType dtype = DType::F32;
  TensorKind kind = TensorKind::Activation;
  int layer = -1;               // transformer layer, -1 outside the blocks
  // Parameters only.
  std::vector<int64_t> full_shape;  // the logical tensor across all tp ranks
  ShardSpec shard;
  bool decay = true;            // weight decay applies
  // The format of the gradient buffer bound to it (precision.grad_accum). A 16-bit parameter
  // with an fp32 buffer has its weight gradient accumulated straight into the buffer (no fp32
  // copy, no rounding); a 16-bit buffer gets each node's fp32 gradient rounded once per add.
  DType grad_dtype = DType::F32;
  bool seq_partial = false;     // sequence parallelism: each tensor-parallel rank's gradient covers only
                                // its rows (norms, row-parallel biases); the caller sums it over tp
  // Filled by Graph::finalize().
  int producer = -1;            // node that writes it (-1: param or input)
  int last_use = -1;            // last node (forward order) that reads it
  bool saved = false;           // some backward (or a recompute) reads it
  size_t nbytes() const { return static_cast<size_t>(numel_of(shape)) * dtype_size(dtype); }
};

struct Node {
  OpKind kind;
  std::string name;             // "h.3.attn.core"
  std::vector<int> in, out;     // tensor ids (see the builder functions for each kind's order)
  std::vector<int> saves;       // tensor ids that backward reads (add_node asks the kind's OpDef)
  int layer = -1;
  Module module = Module::none; // its name: module_name(module) (ops/module.h)
  bool recompute = false;       // discard this node's outputs after forward; recompute in backward
  // Attributes (meaning depends on kind).
  float eps = 0.0f;
  int heads = 0;
  float theta = 0.0f;
  float dropout = 0.0f;
  uint32_t site = 0;            // dropout site id, part of the RNG key
  int64_t vocab_real = 0;       // SoftmaxXent: real (unpadded) vocabulary columns of this shard
  TpMode tp = TpMode::None;
  int64_t vocab_start = 0;      // VocabEmbed / VocabXent: first vocabulary id of this shard
  int heads_total = 0;          // Attention: heads of the whole model (0: heads); this shard computes
  int head_start = 0;           //   [head_start, head_start + heads) -- dropout counters use the logical head
  // Rope, Attention: grouped-query attention (ops/backend.h, Heads). qkv holds `heads` query
  // heads and kv_heads key-value heads (0: heads, multi-head attention); query head h reads
  // key-value head (kv_first + h) / kv_group.
  int kv_heads = 0;
  int kv_group = 1;
  int kv_first = 0;
  bool rope = false;            // Attention in a decode graph: rotate q and k at each row's position (theta)
  bool inplace = false;         // SoftmaxXent: probs overwrite logits (in[0])
  bool dout16 = false;          // Linear with 16-bit inputs and an fp32 output (the logits): the backward reads
                                //   d(out) rounded to the inputs' format (precision.logits_grad: compute)
  // Sequence parallelism (Korthikanti et al. 2022): a column-parallel Linear all-gathers its
  // sequence-sharded input (and saves the shard, re-gathering in backward); a row-parallel
  // Linear reduce-scatters its output back to sequence shards.
  // A vocabulary-parallel Embedding with scatter_output reduce-scatters instead of all-reducing.
  // A Dropout with seq_shard runs on this rank's rows of the micro-batch (its mask counters are
  // offset by those rows).
  bool gather_input = false;
  bool scatter_output = false;
  bool seq_shard = false;
};

class Graph {
 public:
  int add_tensor(TensorDesc d);
  int add_param(const std::string& name, std::vector<int64_t> shape, int layer, bool decay = true,
                ShardSpec shard = {}, std::vector<int64_t> full_shape = {});
  int add_input(const std::string& name, std::vector<int64_t> shape, DType dtype);
  int add_activation(const std::string& name, std::vector<int64_t> shape, int layer, DType dtype = DType::F32);
  int add_node(Node n);  // fills n.saves from its kind's OpDef (ops/ops.h)
  // Computes producers, last uses and saved flags (including the inputs of recompute
  // segments, which must stay alive for the recompute). Call once after building.
  void finalize();

  std::vector<TensorDesc> tensors;
  std::vector<Node> nodes;
  std::vector<int> params;   // tensor ids of parameters, in creation order
  int tokens = -1, targets = -1;   // inputs (B,T) int32
  int logits = -1;                 // (B*T, V)
  int stage_input = -1;            // pipeline stages after the first: the activation received
  int stage_output = -1;           // pipeline stages before the last: the activation sent on
  int losses = -1;                 // (B*T) per-position loss
  int64_t B = 0, T = 0;
  int sp_parts = 1, sp_index = 0;  // sequence parallelism: rows [sp_index*N/sp_parts, ...) of each micro-batch
  // Generation's decode step: T = 1, row b's one token sits at position KvCache::pos[b]
  // (learned positions and rope use it), and Attention nodes attend over the KV cache.
  bool decode = false;

  int find(const std::string& name) const;  // -1 if absent
  int64_t param_count() const;
  // Recompute segments: maximal runs of consecutive recompute nodes in one layer, as
  // [first, last] node indices.
  std::vector<std::pair<int, int>> recompute_segments() const;
  int segment_of(int node) const { return node_segment_[node]; }

 private:
  std::vector<int> node_segment_;
};

}  // namespace ops
