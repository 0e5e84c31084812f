// Medium-depth profiling, on request (`runner train ... --profile FROM:TO`): per operator kind,
// forward, backward and recompute separately over the profiled steps: calls, time, share of
// the steps' time, FLOPs and bytes moved (from the graph), achieved GFLOP/s and GB/s. The top
// 10 are logged; all of them go to RUN_DIR/profile.json (rank 0's; every rank writes
// profile.rankR.json). Off, it costs nothing: the executor's per-kind timers run anyway.
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/executor.h"
#include "ops/graph.h"
#include "ops/trace.h"
#include "runner/errors.h"

namespace spdlog {
class logger;
}

namespace runner {

struct ProfileWindow {
  int64_t from = 0, to = 0;  // 1-based steps, inclusive; from 0: off
  bool on() const { return from > 0; }
  bool covers(int64_t step) const { return on() && step >= from && step <= to; }
};

// "20:30" (steps 20 to 30), "20" (that step only); empty: off. Throws UserError at `where`
// (the recipe's profile.steps, or --profile) when it is not that form or lies outside 1..steps.
ProfileWindow parse_profile(const std::string& spec, int64_t steps, const SourceLoc& where, const std::string& what);

// One operator kind's figures over the profiled steps, per pass.
struct OpPassFigures {
  int64_t calls = 0;
  double ms = 0, flops = 0, bytes = 0;
};
struct OpFigures {
  std::string op;
  OpPassFigures forward, backward, recompute;
  double ms() const { return forward.ms + backward.ms + recompute.ms; }
  double flops() const { return forward.flops + backward.flops + recompute.flops; }
  double bytes() const { return forward.bytes + backward.bytes + recompute.bytes; }
};

// FLOPs and bytes of each kind's passes, from the graphs that ran `micro_passes` times each
// (micro-batches per step x profiled steps), joined with the measured times. Forward FLOPs are
// the planner's per-node counts (multiply and add as two); a backward does twice a matrix
// product's forward work and once a pointwise one's; a recompute repeats the forward of the
// nodes marked for it. Bytes: the inputs and outputs a pass reads and writes (a backward reads
// the inputs and the output gradient and writes the input gradients: twice the forward's).
std::vector<OpFigures> op_figures(const std::vector<const ops::Graph*>& graphs, int64_t micro_passes,
                                  const std::vector<ops::OpProfile>& measured);

// The roofline of one rank: its measured sgemm peak (FLOP/s) and memory bandwidth (bytes/s).
struct Roofline {
  double peak_flops = 0, bandwidth = 0;
  double ridge() const { return bandwidth > 0 ? peak_flops / bandwidth : 0; }  // FLOPs per byte
  // What an operator of this arithmetic intensity can reach: min(peak, intensity x bandwidth).
  double roof(double intensity) const { return std::min(peak_flops, intensity * bandwidth); }
};

// profile.json's content; logs the top 10 by time on `log`. Per operator, with the roofline:
// its arithmetic intensity, compute- or memory-bound (intensity above or below the ridge),
// the roof at its intensity and the fraction of it reached.
nlohmann::json profile_json(const std::vector<OpFigures>& ops, const ProfileWindow& w, double steps_ms, const Roofline& roof,
                            spdlog::logger* log);

// One profiled step's attempt on the timeline: its operator nodes (ops::Executor::set_trace),
// and the spans the communicators, the pipeline runner and the training loop reported while it
// ran, its checkpoint work included (ops::TraceSink); `calls`: the communicators' own counts
// of the calls made in that time ("dp iallreduce" -> 3), to check the trace against.
struct TraceStep {
  int64_t step, t0_ns, t1_ns;
  std::vector<ops::TraceEvent> ops;
  std::vector<ops::TraceSpan> spans;
  std::map<std::string, int64_t> calls;
};

// The sink the trainer hands to the grid's communicators and the pipeline runner while a
// profiled step runs: each span is filed under the step attempt that was current when it
// began (a non-blocking collective may complete after its step), thread-safe.
class StepSpans : public ops::TraceSink {
 public:
  // The current step attempt (an index into the trainer's list; -1: none, spans dropped).
  void set_current(int64_t i) {
    std::lock_guard<std::mutex> g(m_);
    current_ = i;
  }
  int64_t mark() override {
    std::lock_guard<std::mutex> g(m_);
    return current_;
  }
  void span(const ops::TraceSpan& s) override {
    std::lock_guard<std::mutex> g(m_);
    const int64_t i = s.mark >= 0 ? s.mark : current_;
    if (i >= 0) spans_[i].push_back(s);
  }
  // The spans filed under attempt i, removed from the sink.
  std::vector<ops::TraceSpan> take(int64_t i) {
    std::lock_guard<std::mutex> g(m_);
    std::vector<ops::TraceSpan> v = std::move(spans_[i]);
    spans_.erase(i);
    return v;
  }

 private:
  std::mutex m_;
  int64_t current_ = -1;
  std::map<int64_t, std::vector<ops::TraceSpan>> spans_;
};

// Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev) of the profiled steps, all on
// pid `rank`, timestamps in microseconds from `origin_ns` (steady clock), "step" in every
// event's args. Tracks (tid): 0 steps (an "X" event per step), 1 operators (one per node
// executed, its kind, pass and node in args), 2 step phases (data wait, gradient sync wait,
// gradient norm, optimizer, checkpoint), 3 pipeline (each micro-batch pass, and the idle
// waits on a neighbour: the bubble), 4 blocking communication (collectives and send/recv,
// "X"). Non-blocking collectives and sends are async slices ("b"/"e" pairs, one id each), so
// Perfetto draws the hidden all-reduce on a track of its own; their args say how much of them
// the rank waited for (exposed_ms) and how much ran behind compute (hidden_ms). Every
// communication event has its op, group, bytes (and peer, tag for send/recv) in args.
nlohmann::json trace_json(const std::vector<TraceStep>& steps, int rank, const std::string& grid_name, int64_t origin_ns);

// profile.json's "communication": per profiled step attempt, the communicators' call counts.
nlohmann::json comm_calls_json(const std::vector<TraceStep>& steps);

}  // namespace runner
