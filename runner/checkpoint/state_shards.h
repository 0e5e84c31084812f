// The training state across ranks: between this rank's shards and the logical,
// layout-independent tensors a checkpoint stores (docs/checkpoint-format.md).
//
// A logical tensor is the full parameter of the unsharded model, with the vocabulary
// dimension cut to the real vocabulary (tensor parallelism may pad it; padding rows are not
// stored and load as zeros). Any layout can therefore read what any other layout wrote:
// each rank maps its shard's elements to logical indices (runner::shard_to_full_index). Which
// parameters exist, their shapes, shards and owning stages come from the plan's ModelLayout:
// no path here builds a graph.
//
// Saving, two ways, the same file:
// - write_sharded (synchronous): every rank writes its slice of every logical tensor into the one
//   file with parallel HDF5 (write_checkpoint_collective); one replica of each shard writes
//   (data-parallel rank 0), ZeRO-1 pieces of the Adam moments assembled over the data-parallel
//   group first. Nothing is gathered on one rank.
// - gather_logical_state: the logical state assembled on world rank 0, which writes it through
//   the saver (saver.h: what asynchronous saves use: the writer thread needs the whole state
//   in host memory).
// Loading: every rank reads the logical tensors of its own parameters from the file and keeps
// its slice.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/grid.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/model/layout.h"
#include "runner/state.h"

namespace runner {

// Element copies between tensor-parallel shard `d` (LogicalParam::shard) of parameter `p` and
// its logical tensor (p.logical_shape); vocabulary padding rows are dropped, and load as zeros.
void shard_to_logical(const LogicalParam& p, const ops::TensorDesc& d, const float* shard, float* logical);
void logical_to_shard(const LogicalParam& p, const ops::TensorDesc& d, const float* logical, float* shard);

// Collective over grid.world(): the logical training state, complete on world rank 0 (other
// ranks return a state without tensors). `local` is this rank's state (its parameters in
// layout.stage_params order of its stage).
TrainState gather_logical_state(const ModelLayout& layout, parallel::Grid& grid, const TrainState& local);

// Collective over grid.world() (every rank calls it at the same step): writes the checkpoint of
// local.step into `dir` with parallel HDF5 — each logical tensor's slices are written by the
// ranks holding them (data-parallel rank 0 of each shard; ZeRO-1 moment pieces assembled over dp
// first), into one temporary file, collectively; then rank 0 verifies, fsyncs, renames and writes
// LATEST. Returns the same SaveResult on every rank once the checkpoint is published (or throws on
// every rank). Synchronous; what comes around a save (a write in flight, a step already saved,
// retention) is the saver's (saver.h). Every rank's /rng/rank_<r> and /data/rank_<r> hold its own
// RNG state and data cursor. With a one-rank grid (no MPI) the same code writes through the serial
// HDF5 driver.
SaveResult write_sharded(const ModelLayout& layout, parallel::Grid& grid, const std::string& dir,
                         const TrainState& local, const WriteOptions& opt);

// What tensor-parallel rank `tp_rank` writes of parameter `p` from its shard (`src`: the shard's
// data), as write_checkpoint_collective takes it: dim-0 splits as row runs (one per block),
// other splits as a strided hyperslab of each row; vocabulary padding rows dropped; a
// replicated tensor written by tensor-parallel rank 0 only.
TensorSlice shard_slice(const LogicalParam& p, int tp_rank, const float* src);

// One rank's state as a checkpoint stores it, without a collective: the same tensors (shared,
// not copied), except that 16-bit values are replaced by the fp32 masters (or, without masters,
// by an exact fp32 widening). For a run whose masters are whole tensors (no ZeRO-1 sharding).
TrainState fp32_weights_view(const TrainState& s);

// What a rank of pipeline stage `stage` loads: its parameters under their logical names and
// shapes, no moments, in host memory whatever the run's device (the file is read into it, then
// each rank copies its slice in; generate, export and import use it as it is).
TrainState logical_template(const ModelLayout& layout, int stage, int world_rank, int world_size);
// Copies the slices of a rank at (stage, tp_rank) out of a loaded logical state (from
// logical_template) into `local`: parameter values, Adam moments (this rank's ZeRO piece when
// ParamSet::owned says so) and every scalar (step, tokens, data cursor, RNG, loss scaler, recipe).
void load_local_from_logical(const ModelLayout& layout, int stage, int64_t tp_rank, const TrainState& logical,
                             TrainState& local);

}  // namespace runner
