// What a run reports: one JSON record per step (and per evaluation, rollback and the end) in
// metrics.jsonl, the fixed-format step line every train.log_every steps, MFU against the
// measured peak, and at the end the pipeline idle time, the hidden data-parallel
// communication, each memory account's measured peak beside the plan's prediction, and the
// top operators. Rank 0 writes; the end-of-run tables are collective.
#pragma once
#include <optional>
#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ops/executor.h"
#include "ops/tensor.h"
#include "parallel/grid.h"
#include "runner/observe/records.h"
#include "runner/perf/cost.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}

namespace runner {

// A step's wall time, split into parts that do not overlap (coarse profiling, always on):
// the step itself (data .. other, summing to total_ms) and the work between two step records
// (rollback, checkpoint). Communication hidden behind the backward overlaps compute and is
// not a part. `other` is what no part timed (memory bookkeeping, loop overhead).
struct Breakdown {
  enum Part { Data, Forward, Backward, Optimizer, CommExposed, PipelineIdle, LossScale, Rollback, Checkpoint, Other, kParts };
  static const char* name(int part);  // "data_ms", "forward_ms", ...
  std::array<double, kParts> ms{};
  static Breakdown of(const StepResult& s);
  double interval() const;  // the sum: the step's total_ms plus rollback and checkpoint
  // Time this rank spent on its own step, not waiting on others or on data: the step less
  // data, exposed communication and pipeline idle (checkpoint and rollback work, which wait
  // on the other ranks too, are left out).
  double busy() const { return ms[Forward] + ms[Backward] + ms[Optimizer] + ms[LossScale] + ms[Other]; }
};

// An alert the monitoring raised: once per run, printed and recorded in metrics.jsonl.
struct Alert {
  std::string name;  // "communication", "data_wait", "straggler", "memory", "utilization", "loss_spike", "grad_norm_spike", "stage_imbalance"
  int64_t step = 0;
  double value = 0, threshold = 0;
  std::string message, action;
};

class RunMetrics {
 public:
  RunMetrics(const Plan& plan, parallel::Grid& grid, std::shared_ptr<spdlog::logger> log);

  // Rank 0: opens RUN_DIR/metrics.jsonl for appending; on resume (resumed_from >= 0) it first
  // keeps only what happened up to that step, so the file reads as one uninterrupted run.
  void open(const std::string& run_dir, int64_t resumed_from);
  // The job's peak FLOP/s for MFU, its kind ("recipe", "device table", "measured", "cached")
  // and where it came from (runner/perf/peak.h), for the start-up line and the summary.
  void set_peak_flops(double flops, std::string kind = "", std::string source = "") {
    peak_flops_ = flops;
    peak_kind_ = std::move(kind);
    peak_source_ = std::move(source);
  }
  double peak_flops() const { return peak_flops_; }
  const std::string& peak_source() const { return peak_source_; }

  // The plan's predicted step (runner/perf/cost.h): each monitor record and line then carries
  // the measured exposed-communication share beside the predicted one, and past the rule of
  // thumb of 30% the "communication" alert names `advise(measured share)`: the layout change
  // the search would make (runner/perf/layout_advice.h), asked once, only then.
  void set_prediction(const StepCost& predicted, std::function<std::string(double measured_share)> advise) {
    predicted_ = predicted;
    advise_ = std::move(advise);
  }
  // After each step's passes: the measured peak of each memory account.
  void measure_memory();
  // After each step: its record (a save's stall `checkpoint_ms` is reported with the step after
  // it, so a kill during the save never loses the history the checkpoint covers).
  void step(int64_t step, int64_t tokens, const StepResult& s, double checkpoint_ms);
  // Collective, every rank, after each step: the step line (every train.log_every steps, at the
  // first and at the last step) and, every monitor_interval() steps and at the last, monitor().
  void step_line(int64_t step, const StepResult& s);
  // train.monitor_every; 0: the smallest multiple of log_every that is at least 100 steps.
  int64_t monitor_interval() const;
  void eval(int64_t step, const EvalResult& e);
  void rollback(int64_t step, int64_t to_step, double loss);
  // Collective: the end-of-run tables and the summary record.
  void summary(int64_t steps, int64_t tokens, const EvalResult& e, double wall_s, std::vector<ops::OpProfile> prof);
  // Collective, every rank, at each monitor interval's end (step_line): starts gathering each
  // rank's breakdown over the last interval (a small non-blocking all-reduce, so no rank waits
  // for the slowest here) and
  // completes the previous interval's gather, which long finished: rank 0 writes that
  // interval's monitor record (step-time percentiles, tokens/s, MFU, utilization, memory per
  // account, skipped steps, checkpoint cost, slowest rank and stage; its own figures as they
  // were at the interval's end) and raises the alerts that first hold. So a record comes one
  // step line late (step_line completes it); summary() and flush_monitor() complete the last.
  void monitor(int64_t step);
  // Collective: completes the gather in flight, if any, and writes its record now.
  void flush_monitor();
  const std::vector<Alert>& alerts() const { return alerts_; }
  // A rank's row in the gathered breakdown: the parts' sums, then steps, busy P50 and P99 of
  // the interval, pipeline stage, step-time max, dp coordinate.
  static constexpr int kRow = Breakdown::kParts + 6;
  // Whether `step` gets a step line (and, with precision.diagnostics, a gradient range report).
  bool logged(int64_t step) const;
  // Final loss-scaler figures for the summary (fp16).
  void set_scaler(const LossScalerState& s, bool active) { scaler_ = s; scaler_active_ = active; }
  // Mean step time of the steps after the first (which warms caches); 0 before there are any.
  double mean_step_ms() const { return timed_ ? sum_ms_ / static_cast<double>(timed_) : 0.0; }

 private:
  void write(const std::string& line);  // rank 0: one record, flushed
  void print_step_line(int64_t step, const StepResult& s);
  // Rank 0: raises `a` unless an alert of its name was raised before.
  void raise(Alert a);
  // Collective: every rank's row (kRow doubles) on rank 0, in world-rank order.
  std::vector<std::array<double, kRow>> gather(const std::array<double, Breakdown::kParts>& parts, double steps);
  // This rank's row of a gather: `parts` and `steps`, the window's busy P50/P99, stage, slowest step, dp.
  void fill_row(double* row, const std::array<double, Breakdown::kParts>& parts, double steps) const;
  void breakdown_table(const std::vector<std::array<double, kRow>>& rows);
  // An interval's gather in flight, with rank 0's own figures at the interval's end.
  struct PendingMonitor {
    int64_t step = 0;
    std::vector<double> all;  // world_size x kRow, summed in place
    std::unique_ptr<parallel::Request> req;
    double p50 = 0, p90 = 0, p99 = 0, max = 0, peak = 0, checkpoint_ms = 0;
    size_t timed = 0;
    int64_t skipped = 0;
    std::array<size_t, ops::kAccounts> memory{};
  };
  std::unique_ptr<PendingMonitor> pending_;
  void report_monitor(const PendingMonitor& p, const std::vector<std::array<double, kRow>>& rows);
  std::string device_memory_check(nlohmann::json& j, double accounts_peak) const;
  void add_breakdown(int64_t step, const StepResult& s, const Breakdown& b);
  void spike_alerts(int64_t step, const StepResult& s);
  void grad_range(int64_t step, const GradReport& r, nlohmann::json& record);
  nlohmann::json ledger_json();
  nlohmann::json top_ops_json(std::vector<ops::OpProfile> prof);
  nlohmann::json per_rank_json(const std::vector<std::array<double, kRow>>& ranks) const;
  nlohmann::json step_ms_percentiles() const;
  void monitor_alerts(const PendingMonitor& p, const std::vector<std::array<double, kRow>>& rows, double util,
                      size_t slow_stage, const std::vector<double>& stage_busy, double imbalance);
  void communication_alert(int64_t step, double share, size_t rank);
  std::string rank_name(size_t world_rank) const;  // "rank 3 (dp 1 tp 1 pp 0)"
  std::array<double, Breakdown::kParts> window_parts_{}, total_parts_{};
  double window_steps_ = 0, total_steps_ = 0;
  std::vector<double> step_times_, busy_times_;  // per step after the first
  std::vector<double> window_busy_;
  double loss_ema_ = 0, norm_ema_ = 0;
  int64_t ema_steps_ = 0, skipped_ = 0;
  double checkpoint_total_ = 0;
  std::vector<Alert> alerts_;
  void summarize_range(const GradReport& r);
  void mfu_line(double mfu);
  const Plan& plan_;
  parallel::Grid& grid_;
  std::shared_ptr<spdlog::logger> log_;
  std::ofstream file_;
  double peak_flops_ = 0;
  int64_t resumed_from_ = -1;  // the step this job resumed from (-1: it started the run)
  std::string peak_kind_, peak_source_;
  std::array<size_t, ops::kAccounts> measured_peak_{};
  double sum_ms_ = 0;
  int64_t timed_ = 0;
  double window_ms_ = 0, window_data_ = 0;
  int64_t window_ = 0;
  double pipe_wait_total_ = 0, step_ms_total_ = 0, comm_hidden_total_ = 0, comm_exposed_total_ = 0;
  std::optional<StepCost> predicted_;                 // set_prediction
  std::function<std::string(double)> advise_;
  std::optional<std::string> advice_;                 // advise_'s answer, once asked
  std::optional<GradReport> last_range_;  // the last gradient range report
  bool conflict_warned_ = false;
  bool mfu_warned_ = false;  // MFU above 100% said at a step line
  LossScalerState scaler_;
  bool scaler_active_ = false;
  int64_t overflows_ = 0;
};

// "12.3k", "1.50M": counts for the step line.
std::string human_count(double v);
// "45s", "12m", "2.5h"; "?" when unknown.
std::string human_duration(double seconds);

}  // namespace runner
