// The tracer of a profiled run (`--profile FROM:TO`, profile.steps): begins and ends each
// profiled step's trace (operator events, the communicators', pipeline's and loop's spans, the
// communicators' call counts), adds up the steps' operator times, and after the window's last
// step writes profile.rankR.json (and rank 0's profile.json) and trace.rankR.json, which rank 0
// merges into trace.json. The step loop calls it at every step; outside the window each call
// returns at once, so the loop carries no `if (profiled)`. Formatting lives in op_profile.h.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/executor.h"
#include "ops/graph.h"
#include "ops/trace.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/observe/op_profile.h"
#include "runner/observe/step_timer.h"

namespace spdlog {
class logger;
}

namespace runner {

// What the tracer sees of this rank's model (runner/train/rank_model.h implements it; observe/
// stands below train/): where its executors and pipeline report, and its operator times.
class TracedModel {
 public:
  virtual ~TracedModel() = default;
  virtual void set_trace(std::vector<ops::TraceEvent>* sink) = 0;  // the executors' node events; null: off
  virtual void set_pipeline_trace(ops::TraceSink* sink) = 0;       // the pipeline's spans; null: off
  virtual std::vector<ops::OpProfile> profile() const = 0;         // per operator kind, cumulative
  virtual std::vector<const ops::Graph*> graphs() const = 0;
};

// into += a - b, per operator kind (b may lack kinds a has).
void add_ops(std::vector<ops::OpProfile>& into, const std::vector<ops::OpProfile>& a, const std::vector<ops::OpProfile>& b);

class Tracer {
 public:
  // Spans go to `timer` too while a step is recorded. The tracer must be declared before
  // everything that may hold a request reporting to its sink (pipeline sends, gradient
  // buckets, the monitor's gather), so that it outlives them.
  Tracer(parallel::Grid& grid, StepTimer& timer) : grid_(grid), timer_(timer) {}
  // The grid outlives the tracer: its communicators must not report to our sink after us (a
  // profiled step left by an exception).
  ~Tracer() { grid_.set_trace(nullptr); }
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void set_window(ProfileWindow w) { window_ = w; }
  const ProfileWindow& window() const { return window_; }
  // A resume inside the window profiles the rest of it; past it, nothing.
  void resumed_at(int64_t step);
  // Collective, when profiling: this rank's roofline, its share of the job's peak and the
  // memory bandwidth every rank measures at once (as they will run).
  void measure_roofline(double job_peak_flops);

  // Before step `step` (1-based) runs: when the window covers it, its trace attempt begins.
  void begin(int64_t step, TracedModel& model);
  // After the step's passes: the step's span ends and its operator times are added.
  void step_done(double step_ms);
  // After the step's checkpoint work: the attempt's trace ends. True when `step` (completed)
  // is the window's last: then write() is due.
  bool end(int64_t step);
  // After the window's last step: the profile and trace files in `run_dir`, the top operators
  // logged (collective).
  void write(const std::string& run_dir, int64_t micro_per_step, spdlog::logger* log);

 private:
  void write_traces(const std::string& run_dir);

  parallel::Grid& grid_;
  StepTimer& timer_;
  // The sink of communicators, pipeline and loop while a profiled step runs.
  StepSpans spans_;
  ProfileWindow window_;
  Roofline roofline_;
  TracedModel* model_ = nullptr;  // the model of the profiled steps
  bool recording_ = false;        // between begin() and end() of a profiled step
  std::vector<ops::OpProfile> before_;  // the model's operator times when the step began
  std::vector<ops::OpProfile> ops_;     // summed over the profiled steps' passes (evaluation excluded)
  double steps_ms_ = 0;
  std::vector<TraceStep> steps_;  // the profiled steps' attempts, with their operator events and spans
  std::vector<parallel::CommCounts> comm_before_;  // per grid communicator, at the attempt's start
};

}  // namespace runner
