// The model's layout over the process grid, derived once (docs/invariants.md, invariant 1).
//
// The plan builds one ModelLayout from the resolved recipe. It holds, for every virtual
// pipeline stage (a pipeline stage's model chunk; one per stage except under the interleaved
// schedule), the graph spec and tensor-parallel rank 0's graph of it, and one logical
// parameter table: every parameter of the unsharded model, with its full shape, the shape a
// checkpoint stores, how tensor parallelism splits it, which pipeline stages hold it and
// which one writes it. The ledger dry-runs its graphs; the trainer builds its rank's graphs
// from its specs; every checkpoint path (save, gather, load, resume on another layout) reads
// its table. Nothing else builds a graph to learn a shape, and no code outside the model
// builder (runner/model/gpt.cpp) spells a parameter's name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/graph.h"
#include "runner/model/gpt.h"

namespace runner {

// One parameter of the logical (unsharded, one-stage) model.
struct LogicalParam {
  std::string name;                    // "h.3.attn.qkv.weight"
  std::vector<int64_t> full_shape;     // unsharded, the vocabulary padded to a multiple of tp
  std::vector<int64_t> logical_shape;  // as checkpoints store it: vocabulary rows cut to the real vocabulary
  bool vocab_rows = false;             // dimension 0 indexes the vocabulary
  std::vector<int> stages;             // pipeline stages holding a copy (the tied embedding: first and last)
  int writer_stage() const { return stages.front(); }
  bool tied() const { return stages.size() > 1; }  // its copies' gradients are summed across stages
  ops::TensorDesc desc;                // tensor-parallel rank 0's shard, as the graph has it
  bool tp_replicated() const { return desc.shard.dim < 0 || desc.shard.parts <= 1; }
  // Tensor-parallel rank `tp_rank`'s shard of it.
  ops::TensorDesc shard(int64_t tp_rank) const;
};

class ModelLayout {
 public:
  // `whole` is the whole model's spec on tensor-parallel rank 0 (micro-batch, tp, sequence
  // parallelism, padded vocabulary, dtype, recompute sets); `stage_layers` splits its layers
  // over the pipeline stages, each cut into `chunks` model chunks.
  ModelLayout(const GptSpec& whole, std::vector<int64_t> stage_layers, int64_t chunks);

  int pp() const { return static_cast<int>(stage_layers_.size()); }
  int64_t chunks() const { return chunks_; }
  int vstages() const { return pp() * static_cast<int>(chunks_); }
  int stage_of(int vstage) const { return vstage % pp(); }
  int64_t vocab() const { return whole_.model.vocab_size; }  // the real vocabulary
  int64_t param_count() const { return param_count_; }        // logical elements, padded vocabulary included

  // The graph spec of virtual stage `vstage` (chunk vstage / pp of stage vstage % pp: the model
  // cut into pp x chunks pieces in order) on tensor-parallel rank `tp_rank`.
  GptSpec spec(int vstage, int64_t tp_rank = 0) const;
  // Tensor-parallel rank 0's graph of virtual stage `vstage`, built once.
  const ops::Graph& graph(int vstage) const { return graphs_[static_cast<size_t>(vstage)]; }

  // The logical parameter table, in checkpoint order: stage by stage, each stage's parameters
  // in the order its rank holds them; a parameter held by several stages comes with the first.
  const std::vector<LogicalParam>& params() const { return params_; }
  // A pipeline stage's parameters as indices into params(), in the order a rank of the stage
  // holds them (ParamSet order: its chunks in order, each in graph order, each name once).
  const std::vector<int>& stage_params(int stage) const { return stage_params_[static_cast<size_t>(stage)]; }
  // The shards a rank at (stage, tp_rank) holds, in stage_params order.
  std::vector<ops::TensorDesc> rank_params(int stage, int64_t tp_rank) const;
  // Index into params() of `name`; -1 if the model has no such parameter.
  int find(const std::string& name) const;

 private:
  GptSpec whole_;
  std::vector<int64_t> stage_layers_;
  int64_t chunks_ = 1;
  std::vector<ops::Graph> graphs_;
  std::vector<LogicalParam> params_;
  std::vector<std::vector<int>> stage_params_;
  int64_t param_count_ = 0;
};

}  // namespace runner
