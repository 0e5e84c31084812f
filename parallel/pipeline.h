// Pipeline schedules: the order of forward and backward micro-batch passes on one stage.
//
// GPipe (Huang et al. 2019): all forwards, then all backwards; every micro-batch's
// activations are alive at once. 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs
// min(p-s-1, m) warm-up forwards, then alternates one forward and one backward, then drains
// the backwards; at most min(p-s, m) micro-batches are in flight. Both have the bubble
// (p-1)/(m+p-1) of the ideal step time.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/executor.h"
#include "ops/graph.h"
#include "ops/trace.h"
#include "parallel/comm.h"

namespace parallel {

struct PipeAction {
  bool forward = true;
  int micro = 0;
  int chunk = 0;  // interleaved: which of the stage's model chunks (virtual stage chunk*stages + stage)
};

std::vector<PipeAction> schedule_1f1b(int stage, int stages, int micros);
std::vector<PipeAction> schedule_gpipe(int stage, int stages, int micros);
// Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM's schedule): the model is cut into
// stages x chunks pieces, stage s holding chunks s, s + stages, ...; micro-batches go through
// the chunks in groups of `stages`; the bubble shrinks to (p-1)/(v*m+p-1). micros must be a
// multiple of stages.
std::vector<PipeAction> schedule_interleaved(int stage, int stages, int micros, int chunks);
// By name ("1f1b" | "gpipe" | "interleaved"); throws std::invalid_argument otherwise.
std::vector<PipeAction> pipeline_schedule(const std::string& name, int stage, int stages, int micros, int chunks = 1);
// The most micro-batches whose activations of model chunk `chunk` a stage holds at once.
int max_in_flight(const std::vector<PipeAction>& schedule, int chunk = 0);

}  // namespace parallel

// ---- running a schedule on one stage -------------------------------------------------------
namespace parallel {

struct MicroBatch {
  const int32_t* tokens = nullptr;   // (B,T); stages without an embedding ignore them
  const int32_t* targets = nullptr;  // (B,T); read by the last stage
  int64_t sample_offset = 0;         // first sample's index in the global batch (dropout counters)
};

struct PipelineStats {
  double forward_ms = 0, backward_ms = 0;
  double wait_ms = 0;   // blocked on a neighbour: receives, and sends still in flight when a buffer is reused
  double comm_ms = 0;   // collectives inside the passes (set_comm_clock), not counted in forward/backward
  double loss_sum = 0;  // sum of per-position losses (last stage)
};

// One pipeline stage: for each of its model chunks (one, or several under the interleaved
// schedule) the chunk's executors (one per micro-batch of that chunk in flight, all bound to
// the same parameters), its neighbours and the activation/gradient buffers exchanged with
// them (communication account). Receives block; sends do not (a buffer is reused only after
// its send completed), which with these schedules cannot deadlock (tests/test_pipeline.cpp).
// With one stage it simply runs the schedule's passes.
struct PipelineChunk {
  const ops::Graph* graph = nullptr;
  std::vector<ops::Executor*> slots;
  int vstage = 0;              // its place in the pipeline of all chunks
  int prev_rank = -1, next_rank = -1;  // world ranks of the neighbouring chunks (-1: none)
};

class PipelineRunner {
 public:
  PipelineRunner(std::vector<PipelineChunk> chunks, Communicator& world);
  ~PipelineRunner();

  // Training passes of one step in `schedule`'s order. `final_hook(chunk, node)` is installed as
  // the gradient hook of each chunk's backward of the step's last micro-batch (when that
  // chunk's gradients become final). dloss as in ops::Executor::backward.
  PipelineStats train(const std::vector<PipeAction>& schedule, const std::vector<MicroBatch>& mbs, float dloss, uint64_t key,
                      const std::function<void(int, int)>& final_hook);
  // Inference forward of one micro-batch through the pipeline; the last stage's loss sum and count.
  ops::Executor::LossSum forward(const MicroBatch& mb);
  // Inference forward to the logits: the last stage returns its (B*T, V) logits shard; other
  // stages pass their activations on and return null.
  const ops::Tensor* forward_logits(const int32_t* tokens);
  // A cumulative millisecond counter of the collectives the executors make inside their passes
  // (tensor parallelism, parallel::TimedGroup): train() moves its growth during each pass from
  // forward/backward to PipelineStats::comm_ms. Null: none.
  void set_comm_clock(const double* ms) { comm_clock_ = ms; }
  // While set, train() reports each micro-batch pass ("forward mb K", category "pass") and
  // each wait on a neighbour ("idle: ...", category "pipeline": the bubble) to `sink`.
  void set_trace(ops::TraceSink* sink) { trace_ = sink; }

 private:
  struct Chunk {
    PipelineChunk c;
    // Received: the executor copies an input activation into its own tensor at once, and a
    // received gradient is read by the backward it arrives for, so one buffer each.
    ops::Tensor act_in, grad_out;
    // Sent: each stays in use until its isend completes, so one per micro-batch in flight.
    std::vector<ops::Tensor> act_out, grad_in;
    std::vector<std::unique_ptr<Request>> act_sends, grad_sends;
  };
  void wait_send(std::unique_ptr<Request>& req, double& wait_ms, int micro);
  void idle(const char* what, int peer, int micro, int64_t t0_ns);
  void pass(const char* what, const PipeAction& a, int64_t t0_ns);
  const ops::Tensor* eval_pass(const MicroBatch& mb, bool logits, ops::Executor::LossSum* ls);
  std::vector<Chunk> chunks_;
  Communicator& world_;
  const double* comm_clock_ = nullptr;
  ops::TraceSink* trace_ = nullptr;
};

}  // namespace parallel
