// Medium-depth profiling, on request (`runner train ... --profile FROM:TO`): per operator kind,
// forward, backward and recompute separately over the profiled steps: calls, time, share of
// the steps' time, FLOPs and bytes moved (from the graph), achieved GFLOP/s and GB/s. The top
// 10 are logged; all of them go to RUN_DIR/profile.json (rank 0's; every rank writes
// profile.rankR.json). Off, it costs nothing: the executor's per-kind timers run anyway.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/executor.h"
#include "ops/graph.h"
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

// Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev) of the profiled steps: one
// complete ("X") event per operator node executed, named by the node with its kind, pass and
// step in args, and one per profiled step, all on pid `rank`, tid 0 (steps) and 1 (operators);
// timestamps in microseconds from `origin_ns` (steady clock, the run's start).
struct TraceStep {
  int64_t step, t0_ns, t1_ns;
  std::vector<ops::TraceEvent> ops;
};
nlohmann::json trace_json(const std::vector<TraceStep>& steps, int rank, const std::string& grid_name, int64_t origin_ns);

}  // namespace runner
