// This rank's share of the model: the graphs of its model chunks (from the plan's layout), one
// executor per micro-batch a chunk holds at once, the gradient synchronisation (tensor-parallel
// partial sums, the tied embedding across stages, data-parallel buckets behind the backward,
// ZeRO-1), and the pipeline runner that executes the plan's schedule. The training loop
// (trainer.cpp) decides what to run; this class knows how a step's passes run on this rank.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/backend.h"
#include "ops/executor.h"
#include "parallel/grad_sync.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "parallel/timed_group.h"
#include "runner/observe/trace.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace runner {

// What the tracer sees of it (TracedModel): executors, pipeline, operator times, graphs.
class RankModel : public TracedModel {
 public:
  // Builds this rank's chunk graphs and executors over `params` (its parameters in the layout's
  // stage_params order, from init_params), and sets their ZeRO-1 ownership (ParamSet::owned).
  RankModel(const Plan& plan, parallel::Grid& grid, ops::Backend& be, ParamSet& params);
  ~RankModel() override;

  // The forward and backward passes of one step over its micro-batches, in the plan's schedule
  // order; parameter gradients are summed over tensor-parallel sequence shards and handed to
  // the data-parallel buckets as the last micro-batch's backward completes each one.
  parallel::PipelineStats train(const std::vector<parallel::MicroBatch>& micro, float dloss, uint64_t key);
  // Waits for the data-parallel reduction and sums the tied embedding's two copies.
  void finish_grads();
  // Sum of squared gradients over the logical model (every element once, whichever ranks hold
  // copies); `extra` is summed over the world in the same all-reduce.
  double global_sum_squares(double& extra);
  // The time global_sum_squares() last spent in its all-reduce (where the ranks meet).
  double last_norm_comm_ms() const { return norm_comm_ms_; }
  // Tensor-parallel collectives so far (cumulative): their calls and milliseconds.
  const parallel::TimedGroup& tp_timer() const { return *tp_timed_; }
  // Whether this rank's copy of parameter i (its owned range) is the one that counts for it in
  // a reduction over the logical model (each element once, whichever ranks hold copies).
  bool counts(size_t i) const;
  void gather_params();  // ZeRO-1: every dp rank gets the updated parameters

  parallel::PipelineRunner& pipe() { return *pipe_; }
  const parallel::GradSync& sync() const { return *sync_; }
  // This rank's model chunks' graphs.
  std::vector<const ops::Graph*> graphs() const override {
    std::vector<const ops::Graph*> g;
    for (const ops::Graph& cg : chunk_graphs_) g.push_back(&cg);
    return g;
  }
  // Time per operator over every executor of this rank.
  std::vector<ops::OpProfile> profile() const override;
  // Every executor of this rank appends its node timings to `sink` (null: off).
  void set_trace(std::vector<ops::TraceEvent>* sink) override {
    for (auto& ex : execs_) ex->set_trace(sink);
  }
  void set_pipeline_trace(ops::TraceSink* sink) override { pipe_->set_trace(sink); }

 private:
  const Plan& plan_;
  parallel::Grid& grid_;
  ops::Backend& be_;
  ParamSet& ps_;
  std::vector<ops::Graph> chunk_graphs_;                  // this rank's model chunks
  std::vector<std::unique_ptr<ops::Executor>> execs_;     // per chunk, one per micro-batch in flight
  std::unique_ptr<parallel::GradSync> sync_;
  std::vector<std::vector<std::vector<int>>> ready_at_;  // [chunk][node] -> parameters final after its backward
  std::vector<char> seq_partial_;    // per parameter: summed over tp first (sequence parallelism)
  std::vector<char> tp_replicated_;  // per parameter: every tp rank holds all of it
  // per parameter: element ranges every tp rank holds whole inside a split shard (replicated
  // key-value rows; runner::replicated_ranges), summed over tp and counted once in the norm
  std::vector<std::vector<std::pair<int64_t, int64_t>>> tp_partial_rows_;
  std::vector<parallel::PipeAction> sched_;
  std::unique_ptr<parallel::PipelineRunner> pipe_;
  std::unique_ptr<parallel::TimedGroup> tp_timed_;  // grid.tp(), timed
  double norm_comm_ms_ = 0;
  int tied_ = -1;  // ParamSet index of the embedding held by the first and the last stage
};

}  // namespace runner
