// The training state across ranks: between this rank's shards and the logical,
// layout-independent tensors a checkpoint stores (ARCHITECTURE.md, "Checkpoint file").
//
// A logical tensor is the full parameter of the unsharded model, with the vocabulary
// dimension cut to the real vocabulary (tensor parallelism may pad it; padding rows are not
// stored and load as zeros). Any layout can therefore read what any other layout wrote:
// each rank maps its shard's elements to logical indices (runner::shard_to_full_index).
//
// Saving gathers the logical state on world rank 0, which writes it through the atomic
// CheckpointManager (synchronously or in the background). One replica of each shard sends
// (data-parallel rank 0); ZeRO-1 pieces of the Adam moments are first assembled over the
// data-parallel group. Loading: every rank reads the logical tensors of its own parameters
// from the file and keeps its slice.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/graph.h"
#include "parallel/grid.h"
#include "runner/plan.h"
#include "runner/state.h"

namespace runner {

// Shape of parameter `d` in a checkpoint: its full shape with vocabulary rows cut to `vocab`.
std::vector<int64_t> logical_shape(const ops::TensorDesc& d, int64_t vocab);
// Element copies between a shard (d.shape) and its logical tensor (logical_shape(d, vocab)).
void shard_to_logical(const ops::TensorDesc& d, const float* shard, float* logical, int64_t vocab);
void logical_to_shard(const ops::TensorDesc& d, const float* logical, float* shard, int64_t vocab);  // padding -> 0

// Collective over grid.world(): the logical training state, complete on world rank 0 (other
// ranks return a state without tensors). `g` and `local` are this rank's graph and state.
TrainState gather_logical_state(const Plan& plan, parallel::Grid& grid, const ops::Graph& g, const TrainState& local);

// What this rank loads: its parameters under their logical names and shapes, no moments.
TrainState logical_template(const ops::Graph& g, int64_t vocab, int world_rank, int world_size);
// Copies this rank's slices of a loaded logical state (from logical_template) into `local`:
// parameter values, Adam moments (this rank's ZeRO piece when ParamSet::owned says so) and
// every scalar (step, tokens, data cursor, RNG, loss scaler, recipe).
void load_local_from_logical(const ops::Graph& g, int64_t vocab, const TrainState& logical, TrainState& local);

}  // namespace runner
