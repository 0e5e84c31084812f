// This rank's share of the model (see rank_model.h).
#include "runner/train/rank_model.h"

#include <algorithm>
#include <chrono>

#include "runner/train/optimizer.h"

namespace runner {

RankModel::RankModel(const Plan& plan, parallel::Grid& grid, ops::Backend& be, ParamSet& ps)
    : plan_(plan), grid_(grid), be_(be), ps_(ps) {
  const ModelLayout& layout = *plan.layout;
  const parallel::Coords c = grid.coords();
  const int P = layout.pp(), V = static_cast<int>(layout.chunks());
  for (int k = 0; k < V; ++k) chunk_graphs_.push_back(build_gpt_graph(layout.spec(k * P + c.pp, c.tp)));
  // Per parameter, from the layout's table: the embedding tied across the first and last stage
  // (two copies whose gradients are summed over the embedding group before the data-parallel
  // reduction), sequence-partial gradients, tensor-parallel replication.
  std::vector<parallel::GradTensor> gts;
  for (size_t i = 0; i < ps.names.size(); ++i) {
    const LogicalParam& p = layout.params()[static_cast<size_t>(layout.find(ps.names[i]))];
    if (p.tied()) tied_ = static_cast<int>(i);
    seq_partial_.push_back(p.desc.seq_partial ? 1 : 0);
    tp_replicated_.push_back(p.desc.shard.dim < 0 ? 1 : 0);
    tp_partial_rows_.push_back(plan.tp > 1 ? replicated_ranges(p.shard(c.tp)) : std::vector<std::pair<int64_t, int64_t>>{});
    gts.push_back({&ps.values[i], &ps.grads[i], static_cast<int>(i) == tied_});
  }
  sync_ = std::make_unique<parallel::GradSync>(grid.dp(), std::move(gts), plan.recipe.parallel.bucket_mb * 1024.0 * 1024.0,
                                               plan.recipe.parallel.zero == 1);
  if (sync_->zero1()) {
    for (size_t i = 0; i < ps.values.size(); ++i) {
      ps.owned.push_back(sync_->owned(static_cast<int>(i)));
      ps.sharded.push_back(sync_->sharded(static_cast<int>(i)));
    }
  }
  // Gradients become final after the backward of the first node (in forward order) reading them.
  for (const ops::Graph& cg : chunk_graphs_) {
    ready_at_.emplace_back(cg.nodes.size());
    for (size_t i = 0; i < ps.names.size(); ++i) {
      int id = cg.find(ps.names[i]);
      if (id < 0) continue;  // another chunk's
      for (int n = 0; n < static_cast<int>(cg.nodes.size()); ++n) {
        const auto& in = cg.nodes[static_cast<size_t>(n)].in;
        if (std::find(in.begin(), in.end(), id) != in.end()) {
          ready_at_.back()[static_cast<size_t>(n)].push_back(static_cast<int>(i));
          break;
        }
      }
    }
  }
  tp_timed_ = std::make_unique<parallel::TimedGroup>(grid.tp().tensors());
  sched_ = plan.schedule(c.pp);
  // Chunk k of this stage is virtual stage k*P + stage; its neighbours are the chunks before
  // and after it, on the previous and next stage (wrapping around between chunks).
  std::vector<parallel::PipelineChunk> pcs;
  for (int k = 0; k < V; ++k) {
    const ops::Graph& cg = chunk_graphs_[static_cast<size_t>(k)];
    parallel::PipelineChunk pc;
    pc.graph = &cg;
    pc.vstage = k * P + c.pp;
    if (pc.vstage > 0) pc.prev_rank = parallel::world_rank_of(grid.shape(), {c.dp, c.tp, (c.pp + P - 1) % P});
    if (pc.vstage < P * V - 1) pc.next_rank = parallel::world_rank_of(grid.shape(), {c.dp, c.tp, (c.pp + 1) % P});
    const int slots = std::max(1, parallel::max_in_flight(sched_, k));
    for (int j = 0; j < slots; ++j) {
      execs_.push_back(std::make_unique<ops::Executor>(cg, be));
      bind_params(*execs_.back(), cg, ps);
      if (plan.tp > 1) execs_.back()->set_group(tp_timed_.get());
      pc.slots.push_back(execs_.back().get());
    }
    pcs.push_back(std::move(pc));
  }
  pipe_ = std::make_unique<parallel::PipelineRunner>(std::move(pcs), grid.world());
  pipe_->set_comm_clock(tp_timed_->ms());
}

RankModel::~RankModel() = default;

parallel::PipelineStats RankModel::train(const std::vector<parallel::MicroBatch>& micro, float dloss, uint64_t key) {
  sync_->start_step();
  return pipe_->train(sched_, micro, dloss, key, [this](int chunk, int node) {
    for (int p : ready_at_[static_cast<size_t>(chunk)][static_cast<size_t>(node)]) {
      ops::Tensor& gr = ps_.grads[static_cast<size_t>(p)];
      if (seq_partial_[static_cast<size_t>(p)]) {  // each tp rank saw only its rows of the sequence
        auto t = std::chrono::steady_clock::now();
        grid_.tp().tensors().iallreduce_sum(gr.raw(), gr.dtype(), gr.numel())->wait();
        tp_timed_->add(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
      }
      // Replicated key-value rows (grouped-query attention): each tp rank's gradient holds
      // only its query heads' share.
      for (auto [a, e] : tp_partial_rows_[static_cast<size_t>(p)]) {
        auto t = std::chrono::steady_clock::now();
        char* base = static_cast<char*>(gr.raw()) + static_cast<size_t>(a) * ops::dtype_size(gr.dtype());
        grid_.tp().tensors().iallreduce_sum(base, gr.dtype(), e - a)->wait();
        tp_timed_->add(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
      }
      sync_->grad_ready(p);
    }
    sync_->progress();
  });
}

void RankModel::finish_grads() {
  sync_->finish_grads();
  if (tied_ >= 0) {  // the two copies of the tied embedding: sum over stages, then over dp
    ops::Tensor& g = ps_.grads[static_cast<size_t>(tied_)];
    if (grid_.embed()) grid_.embed()->tensors().iallreduce_sum(g.raw(), g.dtype(), g.numel())->wait();
    grid_.dp().tensors().iallreduce_sum(g.raw(), g.dtype(), g.numel())->wait();
  }
}

bool RankModel::counts(size_t i) const {
  const parallel::Coords c = grid_.coords();
  if (static_cast<int>(i) == tied_ && !grid_.first_stage()) return false;
  if (tp_replicated_[i] && c.tp != 0) return false;
  if (!ps_.zero_sharded(i) && c.dp != 0) return false;
  return true;
}

double RankModel::global_sum_squares(double& extra) {
  double ss = 0;
  const bool tp0 = grid_.coords().tp == 0;
  for (size_t i = 0; i < ps_.grads.size(); ++i) {
    if (!counts(i)) continue;
    auto [a, e] = ps_.owned_range(i);
    // Replicated key-value rows count on tensor-parallel rank 0 only: the rest of [a, e).
    for (auto [ra, re] : tp0 ? std::vector<std::pair<int64_t, int64_t>>{} : tp_partial_rows_[i]) {
      if (std::min(e, ra) > a) ss += sum_squares(be_, ps_.grads[i], a, std::min(e, ra));
      a = std::max(a, re);
    }
    if (e > a) ss += sum_squares(be_, ps_.grads[i], a, e);
  }
  double v[2] = {ss, extra};
  auto t = std::chrono::steady_clock::now();
  grid_.world().allreduce_sum(v, 2);
  norm_comm_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  extra = v[1];
  return v[0];
}

void RankModel::gather_params() { sync_->gather_params(); }

std::vector<ops::OpProfile> RankModel::profile() const {
  std::vector<ops::OpProfile> prof;
  for (auto& ex : execs_)
    for (auto& p : ex->profile()) {
      auto it = std::find_if(prof.begin(), prof.end(), [&](const ops::OpProfile& q) { return q.name == p.name; });
      if (it == prof.end()) { prof.push_back(p); continue; }
      it->forward_ms += p.forward_ms;
      it->backward_ms += p.backward_ms;
      it->recompute_ms += p.recompute_ms;
      it->calls += p.calls;
    }
  return prof;
}

}  // namespace runner
