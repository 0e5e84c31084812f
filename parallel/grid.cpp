// The dp x tp x pp process grid: Megatron's rank order and the sub-communicators.
#include "parallel/grid.h"

#include <stdexcept>
#include <string>

namespace parallel {

namespace {

void check_shape(const GridShape& g) {
  if (g.dp < 1 || g.tp < 1 || g.pp < 1)
    throw std::invalid_argument("grid shape dp" + std::to_string(g.dp) + " x tp" + std::to_string(g.tp) + " x pp" +
                                std::to_string(g.pp) + ": every axis needs at least 1 rank");
}

}  // namespace

Coords coords_of(const GridShape& g, int world_rank) {
  check_shape(g);
  if (world_rank < 0 || world_rank >= g.world())
    throw std::out_of_range("coords_of: rank " + std::to_string(world_rank) + " outside a grid of " +
                            std::to_string(g.world()));
  Coords c;
  c.tp = world_rank % g.tp;
  c.dp = (world_rank / g.tp) % g.dp;
  c.pp = world_rank / (g.tp * g.dp);
  return c;
}

int world_rank_of(const GridShape& g, const Coords& c) {
  check_shape(g);
  if (c.dp < 0 || c.dp >= g.dp || c.tp < 0 || c.tp >= g.tp || c.pp < 0 || c.pp >= g.pp)
    throw std::out_of_range("world_rank_of: coordinates dp" + std::to_string(c.dp) + ".tp" + std::to_string(c.tp) +
                            ".pp" + std::to_string(c.pp) + " outside the grid");
  return (c.pp * g.dp + c.dp) * g.tp + c.tp;
}

Grid::Grid(std::unique_ptr<Communicator> world, GridShape shape, ops::Backend* device)
    : shape_(shape), world_(std::move(world)) {
  if (!world_) throw std::invalid_argument("Grid: null world communicator");
  world_->set_device(device);  // before the splits, which pass it on
  check_shape(shape_);
  if (world_->size() != shape_.world())
    throw std::invalid_argument("Grid: dp" + std::to_string(shape_.dp) + " x tp" + std::to_string(shape_.tp) +
                                " x pp" + std::to_string(shape_.pp) + " needs " + std::to_string(shape_.world()) +
                                " ranks, the world has " + std::to_string(world_->size()));
  c_ = coords_of(shape_, world_->rank());
  const int dp = shape_.dp, tp = shape_.tp, pp = shape_.pp;

  // Every rank makes the same split calls in the same order (they are collective). The color
  // names the group (the coordinates on the other axes); the key is the coordinate along the
  // axis, so the sub-communicator's rank equals it.
  tp_ = world_->split(c_.pp * dp + c_.dp, c_.tp);
  dp_ = world_->split(c_.pp * tp + c_.tp, c_.dp);
  pp_ = world_->split(c_.dp * tp + c_.tp, c_.pp);
  if (pp > 1) {
    // First and last stage of one (dp, tp) pair; the middle stages form throwaway groups of
    // their own (colors offset past the members') and keep null.
    const bool member = first_stage() || last_stage();
    const int pair = c_.dp * tp + c_.tp;
    auto e = world_->split(member ? pair : dp * tp + pair, c_.pp);
    if (member) embed_ = std::move(e);
  }
  for (Communicator* c : comms()) c->set_device(device);
  world_->set_name("world");
  tp_->set_name("tp");
  dp_->set_name("dp");
  pp_->set_name("pp");
  if (embed_) embed_->set_name("embed");
}

std::vector<Communicator*> Grid::comms() {
  std::vector<Communicator*> c{world_.get(), dp_.get(), tp_.get(), pp_.get()};
  if (embed_) c.push_back(embed_.get());
  return c;
}

void Grid::set_trace(ops::TraceSink* sink) {
  for (Communicator* c : comms()) c->set_trace(sink);
}

int Grid::prev_stage_rank() const {
  if (first_stage()) return -1;
  return world_rank_of(shape_, Coords{c_.dp, c_.tp, c_.pp - 1});
}

int Grid::next_stage_rank() const {
  if (last_stage()) return -1;
  return world_rank_of(shape_, Coords{c_.dp, c_.tp, c_.pp + 1});
}

std::string Grid::name() const {
  return "dp" + std::to_string(c_.dp) + ".tp" + std::to_string(c_.tp) + ".pp" + std::to_string(c_.pp);
}

}  // namespace parallel
