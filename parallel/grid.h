// The dp x tp x pp process grid.
//
// Rank order (Megatron's): tp fastest, then dp, then pp:
//   world_rank = (pp_rank * dp + dp_rank) * tp + tp_rank
// so a tensor-parallel group is a block of consecutive ranks (one node, fast links) and
// pipeline neighbours are dp*tp ranks apart.
//
// Sub-communicators: tp (same dp, pp), dp (same tp, pp), pp (same dp, tp), and embed: the
// first and last pipeline stage of one (dp, tp) pair, which both hold the tied embedding when
// pp > 1 (null on other stages, and when pp == 1).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace parallel {

struct GridShape {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
};

struct Coords {
  int dp = 0, tp = 0, pp = 0;
};

// Pure arithmetic, no communicator: coordinates of a world rank and back.
Coords coords_of(const GridShape& g, int world_rank);
int world_rank_of(const GridShape& g, const Coords& c);

class Grid {
 public:
  // Collective over `world` (all ranks call it). world->size() must equal shape.world();
  // throws std::invalid_argument otherwise (the plan refuses such recipes earlier, with a
  // user-facing message). `device`: the run's backend (select_backend), whose memory the
  // communicators' tensors() calls take (Communicator::set_device); null: host memory.
  Grid(std::unique_ptr<Communicator> world, GridShape shape, ops::Backend* device = nullptr);

  const GridShape& shape() const { return shape_; }
  const Coords& coords() const { return c_; }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  bool first_stage() const { return c_.pp == 0; }
  bool last_stage() const { return c_.pp == shape_.pp - 1; }
  // World ranks of the pipeline neighbours (-1 at the ends).
  int prev_stage_rank() const;
  int next_stage_rank() const;
  // "dp0.tp1.pp0": how logs name this rank.
  std::string name() const;

  Communicator& world() { return *world_; }
  Communicator& dp() { return *dp_; }
  Communicator& tp() { return *tp_; }
  Communicator& pp() { return *pp_; }
  Communicator* embed() { return embed_.get(); }  // null when not a member
  // world, dp, tp, pp and embed (when a member), each named so in traces and counts.
  std::vector<Communicator*> comms();
  // Every communicator of the grid reports its calls to `sink` (null: off).
  void set_trace(ops::TraceSink* sink);

 private:
  GridShape shape_;
  Coords c_;
  std::unique_ptr<Communicator> world_, dp_, tp_, pp_, embed_;
};

}  // namespace parallel
