// Model families expanded into operator graphs.
//
// The `gpt` family (pre-norm GPT-2 / LLaMA-style decoder) becomes one ops::Graph per
// rank: this rank's tensor-parallel shard of every matrix, this pipeline stage's layers,
// one micro-batch. The plan's ledger, the recompute planner and the executor all read
// that graph. Parameter names are stable paths ("h.3.attn.qkv.weight") used by
// checkpoints and the PyTorch fixtures (docs/fixtures.md).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "ops/executor.h"
#include "ops/graph.h"
#include "ops/module.h"
#include "ops/tensor.h"
#include "runner/recipe/recipe.h"

namespace runner {

struct GptSpec {
  ModelConfig model;
  int64_t B = 1;                 // micro-batch sequences
  int64_t T = 0;                 // sequence length (0: model.seq_len)
  int64_t tp = 1, tp_rank = 0;
  bool sequence_parallel = false;  // with tp > 1: norms, dropout and residuals on sequence shards
  int64_t first_layer = 0;       // this pipeline stage's layers [first_layer, last_layer)
  int64_t last_layer = -1;       // -1: n_layers
  bool first_stage = true, last_stage = true;
  int64_t vocab_padded = 0;      // 0: vocab_size rounded up to a multiple of tp
  ops::DType act_dtype = ops::DType::F32;
  ops::DType grad_dtype = ops::DType::F32;  // parameters' gradient buffers (precision.grad_accum)
  bool logits_grad16 = false;  // the output layer reads d(logits) rounded to act_dtype (precision.logits_grad)
  // recompute[layer] = modules of that layer to recompute, closed under ops::with_parts: a node
  // is recomputed iff its layer's set has its module
  std::vector<ops::ModuleSet> recompute;
  // Generation's decode step (ops::Graph::decode): one token per row (T = 1) at the KV
  // cache's positions; the attention reads the cache. Forward only.
  bool decode = false;
};

// Grouped-query attention under tensor parallelism (as Megatron-LM): a rank holds
// n_kv_heads / tp key-value heads when tp divides them, and all of them otherwise
// (replicated: each rank's query heads read their groups' heads, and the gradients of the
// replicated rows are summed over tp). n_heads always divides by tp.
bool kv_replicated(const ModelConfig& m, int64_t tp);
int64_t rank_kv_heads(const ModelConfig& m, int64_t tp);
// The KV cache's element format for the recipe's inference.kv_dtype.
ops::DType kv_cache_dtype(KvFormat f);
// Bytes of one layer's K and V for one position on one tensor-parallel rank (the KV cache's
// unit, ops::KvCache::bytes_for): only the key-value heads are cached.
int64_t kv_cache_position_bytes(const ModelConfig& m, int64_t tp, KvFormat f);

// Vocabulary padded to a multiple of `multiple` (tp): returns the padded size.
int64_t padded_vocab(int64_t vocab, int64_t multiple);

// Per-layer recompute sets from the recipe's recompute section (mode full: ops::layer_modules()).
std::vector<ops::ModuleSet> recompute_sets(const RecomputeConfig& rc, int64_t n_layers);

ops::Graph build_gpt_graph(const GptSpec& spec);
// Graphs build_gpt_graph has built in this process (tests: no checkpoint path builds one).
int64_t graphs_built();
// The parameters whose dimension 0 is the vocabulary (the embedding, an untied head): tensor
// parallelism pads them, checkpoints store only the real vocabulary's rows.
bool gpt_vocab_param(const std::string& name);

// Parameter values and gradients bound to a graph, in graph.params order.
struct ParamSet {
  std::vector<std::string> names;
  std::vector<ops::Tensor> values;   // account: parameters
  std::vector<ops::Tensor> grads;    // account: gradients
  std::vector<bool> decay;
  // Per parameter, the element range [begin, end) this rank's optimizer updates and holds Adam
  // moments for: everything, except under ZeRO-1 (its data-parallel piece). Empty: everything.
  std::vector<std::pair<int64_t, int64_t>> owned;
  std::vector<bool> sharded;  // ZeRO-1 splits this parameter over the data-parallel ranks
  bool zero_sharded(size_t i) const { return i < sharded.size() && sharded[i]; }
  std::pair<int64_t, int64_t> owned_range(size_t i) const {
    return owned.empty() ? std::make_pair<int64_t, int64_t>(0, values[i].numel()) : owned[i];
  }
  int64_t numel() const;
  int index(const std::string& name) const;  // -1 if absent
};

// Allocates and initialises parameters: normal(0, init_std) for matrices and embeddings
// (residual output projections scaled by 1/sqrt(2*n_layers), GPT-2), ones for norm weights,
// zeros for biases. Values are a function of (seed, name, logical element index), so every
// tensor-parallel layout initialises the same logical model. Values take each desc's dtype
// (a 16-bit compute copy holds the fp32 initial value rounded to nearest even); gradients
// each desc's grad_dtype (precision.grad_accum).
ParamSet init_params(const std::vector<ops::TensorDesc>& params, const ModelConfig& m, uint64_t seed);
// The same for a graph's parameters (each name once, in graph order).
ParamSet init_params(const ops::Graph& g, const ModelConfig& m, uint64_t seed);
// The fp32 initial values of one parameter (shard) `d`, as init_params computes them: what the
// fp32 master weights start from.
void init_param_values(const ops::TensorDesc& d, const ModelConfig& m, uint64_t seed, float* out);

// Index of element `i` of a shard in its full logical tensor.
int64_t shard_to_full_index(const ops::TensorDesc& d, int64_t i);
// Element ranges [begin, end) of a split shard that every tensor-parallel rank holds whole
// (ops::ShardSpec::replicated: grouped-query attention's key-value rows when tp does not
// divide the key-value heads). Their gradients are partial per rank and summed over tp; a
// global norm counts them once. Empty for every other tensor.
std::vector<std::pair<int64_t, int64_t>> replicated_ranges(const ops::TensorDesc& d);

}  // namespace runner

namespace runner {
// Binds every parameter of `g` (tied weights included) to its value and gradient in `ps`.
void bind_params(ops::Executor& ex, const ops::Graph& g, ParamSet& ps);
}  // namespace runner

namespace runner {
// ---- the Hugging Face layouts of the gpt family (runner export) ----
// GPT-2 (layernorm, gelu or relu2, learned positions, biases) and Llama (rmsnorm, swiglu, rope). Our
// rope already pairs (i, i + HS/2) ("rotate half", as Hugging Face's Llama does), so q and k
// rows need no permutation.
enum class HfStyle { gpt2, llama };
// The style a model maps to; throws std::invalid_argument saying which choice has no
// counterpart when it maps to neither.
HfStyle hf_style(const ModelConfig& m);
const char* to_string(HfStyle s);
// One tensor of the Hugging Face checkpoint: rows [row_begin, row_begin + rows) of the logical
// parameter `source` (rows -1: all), transposed when `transpose` (GPT-2's Conv1D stores
// (in, out)). Tied embeddings are omitted from the list (the head reads the embedding).
struct HfTensor {
  std::string name;    // "transformer.h.0.attn.c_attn.weight"
  std::string source;  // "h.0.attn.qkv.weight"
  int64_t row_begin = 0, rows = -1;
  bool transpose = false;
};
std::vector<HfTensor> hf_tensors(const ModelConfig& m, HfStyle style);
}  // namespace runner
