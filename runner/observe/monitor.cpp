// Coarse profiling and monitoring: the step-time breakdown, its gathering over ranks, the
// monitor records and the alerts (see metrics.h).
#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ops/device_timer.h"
#include "runner/observe/metrics.h"

namespace runner {

namespace {

// Nearest-rank percentile (q in [0, 1]) of unsorted values; 0 when there are none.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, k > 0 ? k - 1 : 0)];
}

const char* const kAccountNames[] = {"parameters", "gradients", "optimizer", "activations", "workspace", "communication", "kv_cache"};

// Indices of a gathered row beyond the parts.
enum { kSteps = Breakdown::kParts, kBusyP50, kBusyP99, kStage, kStepMax, kDp };

}  // namespace

const char* Breakdown::name(int part) {
  static const char* const names[kParts] = {"data_ms",       "forward_ms",       "backward_ms",   "optimizer_ms",
                                            "comm_exposed_ms", "pipeline_idle_ms", "loss_scale_ms", "rollback_ms",
                                            "checkpoint_ms",   "other_ms"};
  return names[part];
}

Breakdown Breakdown::of(const StepResult& s) {
  Breakdown b;
  b.ms[Data] = s.data_ms;
  b.ms[Forward] = s.fwd_ms;
  b.ms[Backward] = s.bwd_ms;
  b.ms[Optimizer] = s.opt_ms;
  b.ms[CommExposed] = s.comm_exposed_ms;
  b.ms[PipelineIdle] = s.pipe_wait_ms;
  b.ms[LossScale] = s.loss_scale_ms;
  b.ms[Rollback] = s.rollback_ms;
  b.ms[Checkpoint] = s.checkpoint_ms;
  double timed = 0;
  for (int p = 0; p < Other; ++p)
    if (p != Rollback && p != Checkpoint) timed += b.ms[p];
  b.ms[Other] = std::max(0.0, s.total_ms - timed);  // what no part timed; timers never overlap
  return b;
}

double Breakdown::interval() const {
  double t = 0;
  for (double v : ms) t += v;
  return t;
}

void RunMetrics::raise(Alert a) {
  if (grid_.rank() != 0) return;
  for (const Alert& b : alerts_)
    if (b.name == a.name) return;
  log_->warn("ALERT {} at step {}: {}. What to do: {}", a.name, a.step, a.message, a.action);
  write(nlohmann::json{{"alert", a.name},       {"step", a.step},         {"value", a.value},
                       {"threshold", a.threshold}, {"message", a.message}, {"action", a.action}}
            .dump());
  alerts_.push_back(std::move(a));
}

void RunMetrics::fill_row(double* row, const std::array<double, Breakdown::kParts>& parts, double steps) const {
  std::copy(parts.begin(), parts.end(), row);
  row[kSteps] = steps;
  row[kBusyP50] = percentile(window_busy_, 0.5);
  row[kBusyP99] = percentile(window_busy_, 0.99);
  row[kStage] = grid_.coords().pp;
  row[kStepMax] = step_times_.empty() ? 0 : *std::max_element(step_times_.begin(), step_times_.end());
  row[kDp] = grid_.coords().dp;
}

std::vector<std::array<double, RunMetrics::kRow>> RunMetrics::gather(const std::array<double, Breakdown::kParts>& parts,
                                                                     double steps) {
  const int W = grid_.world_size(), me = grid_.rank();
  std::vector<double> all(static_cast<size_t>(W * kRow), 0.0);
  fill_row(all.data() + static_cast<size_t>(me) * kRow, parts, steps);
  grid_.world().allreduce_sum(all.data(), static_cast<int64_t>(all.size()));
  std::vector<std::array<double, kRow>> rows(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) std::copy_n(all.data() + static_cast<size_t>(r) * kRow, kRow, rows[static_cast<size_t>(r)].begin());
  return rows;
}

namespace {

double busy_of(const std::array<double, RunMetrics::kRow>& row) {  // as Breakdown::busy()
  return row[Breakdown::Forward] + row[Breakdown::Backward] + row[Breakdown::Optimizer] + row[Breakdown::LossScale] +
         row[Breakdown::Other];
}
double interval_of(const std::array<double, RunMetrics::kRow>& row) {
  double t = 0;
  for (int p = 0; p < Breakdown::kParts; ++p) t += row[static_cast<size_t>(p)];
  return t;
}

}  // namespace

void RunMetrics::monitor(int64_t step) {
  flush_monitor();
  auto p = std::make_unique<PendingMonitor>();
  p->step = step;
  const int W = grid_.world_size(), me = grid_.rank();
  p->all.assign(static_cast<size_t>(W * kRow), 0.0);
  fill_row(p->all.data() + static_cast<size_t>(me) * kRow, window_parts_, window_steps_);
  if (me == 0) {
    p->p50 = percentile(step_times_, 0.5);
    p->p90 = percentile(step_times_, 0.9);
    p->p99 = percentile(step_times_, 0.99);
    p->max = step_times_.empty() ? 0 : *std::max_element(step_times_.begin(), step_times_.end());
    p->timed = step_times_.size();
    p->memory = measured_peak_;
    p->peak = static_cast<double>(ops::MemoryTracker::instance().peak_total());
    p->skipped = skipped_;
    p->checkpoint_ms = checkpoint_total_;
  }
  p->req = grid_.world().iallreduce_sum(p->all.data(), ops::DType::F64, static_cast<int64_t>(p->all.size()));
  window_parts_ = {};
  window_steps_ = 0;
  window_busy_.clear();
  pending_ = std::move(p);
}

void RunMetrics::flush_monitor() {
  if (!pending_) return;
  std::unique_ptr<PendingMonitor> p = std::move(pending_);
  p->req->wait();
  const int W = grid_.world_size();
  std::vector<std::array<double, kRow>> rows(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) std::copy_n(p->all.data() + static_cast<size_t>(r) * kRow, kRow, rows[static_cast<size_t>(r)].begin());
  report_monitor(*p, rows);
}

namespace {

// What a monitor interval's rows say: per rank (busy time, utilization, the slowest rank) and
// per pipeline stage (mean busy time of its ranks, the slowest stage, the imbalance).
struct MonitorFigures {
  size_t slow = 0;
  double util = 0;
  nlohmann::json per_rank = nlohmann::json::array();
  std::vector<double> stage_busy;
  size_t slow_stage = 0;
  double imbalance = 0;
};

MonitorFigures monitor_figures(const std::vector<std::array<double, RunMetrics::kRow>>& rows, int64_t pp) {
  MonitorFigures f;
  const double n = rows[0][kSteps];
  // Per rank: busy time per step; the slowest rank is the one that worked longest.
  double util_sum = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& row = rows[k];
    const double iv = interval_of(row);
    if (busy_of(row) > busy_of(rows[f.slow])) f.slow = k;
    const double compute = row[Breakdown::Forward] + row[Breakdown::Backward] + row[Breakdown::Optimizer];
    util_sum += iv > 0 ? compute / iv : 0;
    nlohmann::json j{{"rank", k}, {"stage", static_cast<int64_t>(row[kStage])}, {"busy_ms", busy_of(row) / n},
                     {"interval_ms", iv / n}};
    for (int p = 0; p < Breakdown::kParts; ++p) j[Breakdown::name(p)] = row[static_cast<size_t>(p)] / n;
    f.per_rank.push_back(j);
  }
  f.util = util_sum / static_cast<double>(rows.size());
  // Stages: mean busy time of their ranks.
  f.stage_busy.assign(static_cast<size_t>(pp), 0.0);
  std::vector<double> stage_n(static_cast<size_t>(pp), 0.0);
  for (const auto& row : rows) {
    f.stage_busy[static_cast<size_t>(row[kStage])] += busy_of(row) / n;
    stage_n[static_cast<size_t>(row[kStage])] += 1;
  }
  for (size_t s = 0; s < f.stage_busy.size(); ++s) f.stage_busy[s] /= std::max(1.0, stage_n[s]);
  f.slow_stage = static_cast<size_t>(std::max_element(f.stage_busy.begin(), f.stage_busy.end()) - f.stage_busy.begin());
  const double stage_min = *std::min_element(f.stage_busy.begin(), f.stage_busy.end());
  const double top = f.stage_busy[f.slow_stage];
  f.imbalance = top > 0 ? (top - stage_min) / top : 0;
  return f;
}

}  // namespace

namespace {

// The median busy P99 of the ranks other than `k` (rows has at least two).
double peers_busy_p99(const std::vector<std::array<double, RunMetrics::kRow>>& rows, size_t k) {
  std::vector<double> v;
  for (size_t i = 0; i < rows.size(); ++i)
    if (i != k) v.push_back(rows[i][kBusyP99]);
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

namespace {

// The largest share of its interval a rank spent in `part`, and that rank.
std::pair<double, size_t> worst_share(const std::vector<std::array<double, RunMetrics::kRow>>& rows, int part) {
  double frac = 0;
  size_t rank = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const double iv = interval_of(rows[k]);
    if (iv > 0 && rows[k][static_cast<size_t>(part)] / iv > frac) {
      frac = rows[k][static_cast<size_t>(part)] / iv;
      rank = k;
    }
  }
  return {frac, rank};
}

}  // namespace

std::string RunMetrics::rank_name(size_t k) const {
  parallel::Coords c = parallel::coords_of(grid_.shape(), static_cast<int>(k));
  return fmt::format("rank {} (dp {} tp {} pp {})", k, c.dp, c.tp, c.pp);
}

void RunMetrics::report_monitor(const PendingMonitor& pm, const std::vector<std::array<double, kRow>>& rows) {
  const int64_t step = pm.step;
  if (grid_.rank() != 0 || rows[0][kSteps] <= 0) return;
  const double n = rows[0][kSteps];
  const MonitorFigures f = monitor_figures(rows, plan_.pp);
  const double iv0 = interval_of(rows[0]) / n;
  const double tps = iv0 > 0 ? static_cast<double>(plan_.tokens_per_step) / (iv0 / 1e3) : 0;
  const double mfu = peak_flops_ > 0 ? plan_.flops_per_token * tps / peak_flops_ : 0;
  nlohmann::json mem = nlohmann::json::object();
  for (int a = 0; a < ops::kAccounts; ++a) mem[kAccountNames[a]] = pm.memory[static_cast<size_t>(a)];
  nlohmann::json j{{"monitor", true},
                   {"step", step},
                   {"step_ms", {{"p50", pm.p50}, {"p90", pm.p90}, {"p99", pm.p99}, {"max", pm.max}}},
                   {"tokens_per_s", tps},
                   {"mfu", mfu},
                   {"utilization", f.util},
                   {"peak_memory", mem},
                   {"peak_bytes", pm.peak},
                   {"device_memory", plan_.device_memory},
                   {"skipped_steps", pm.skipped},
                   {"checkpoint_ms", pm.checkpoint_ms},
                   {"slowest_rank", f.slow},
                   {"slowest_stage", f.slow_stage},
                   {"stage_imbalance", f.imbalance},
                   {"per_rank", f.per_rank}};
  // The exposed communication's share of the step (the worst rank's) beside the plan's prediction.
  const auto [comm, comm_rank] = worst_share(rows, Breakdown::CommExposed);
  j["comm_share"] = {{"measured", comm}, {"rank", comm_rank},
                     {"predicted", predicted_ ? nlohmann::json(predicted_->comm_share()) : nlohmann::json(nullptr)}};
  const std::string device_line = device_memory_check(j, pm.peak);
  write(j.dump());
  if (!device_line.empty()) log_->info("{}", device_line);
  log_->info("  monitor step {} | step ms p50 {:.0f} p90 {:.0f} p99 {:.0f} max {:.0f} | util {:.0f}% | comm {:.0f}%{} | skipped {} | "
             "checkpoints {:.0f} ms{}",
             step, pm.p50, pm.p90, pm.p99, pm.max, 100 * f.util, 100 * comm,
             predicted_ ? fmt::format(" (predicted {:.0f}%)", 100 * predicted_->comm_share()) : "", pm.skipped, pm.checkpoint_ms,
             rows.size() > 1 ? fmt::format(" | slowest {} busy {:.0f} ms/step", rank_name(f.slow), busy_of(rows[f.slow]) / n) : "");
  monitor_alerts(pm, rows, f.util, f.slow_stage, f.stage_busy, f.imbalance);
}

// On a device that reports its own memory (ops/device_timer.h: the GPU), the record's
// "device_reported" beside the ledger's accounts: the allocator's bytes in use and reserved and
// the driver's, so the accounts (what tensors hold) are cross-checked with what CUDA sees. The
// console line; empty on the CPU.
std::string RunMetrics::device_memory_check(nlohmann::json& j, double accounts_peak) const {
  ops::DeviceTimer* dev = ops::device_timer();
  if (!dev) return "";
  const ops::DeviceTimer::Memory m = dev->memory();
  j["device_reported"] = {{"pool_used", m.pool_used}, {"pool_reserved", m.pool_reserved},
                          {"driver_used", m.driver_used}, {"total", m.total}};
  return fmt::format("  device memory | accounts peak {} | allocator in use {}, reserved {} | driver used {} of {}",
                     format_bytes(accounts_peak), format_bytes(static_cast<double>(m.pool_used)),
                     format_bytes(static_cast<double>(m.pool_reserved)), format_bytes(static_cast<double>(m.driver_used)),
                     format_bytes(static_cast<double>(m.total)));
}

// The alerts of a monitor interval, each raised once per run.
void RunMetrics::monitor_alerts(const PendingMonitor& pm, const std::vector<std::array<double, kRow>>& rows, double util,
                                size_t slow_stage, const std::vector<double>& stage_busy, double imbalance) {
  const Recipe& r = plan_.recipe;
  const int64_t step = pm.step;
  const double p50 = pm.p50, p99 = pm.p99, peak = pm.peak;
  const auto [comm_frac, comm_rank] = worst_share(rows, Breakdown::CommExposed);
  const auto [data_frac, data_rank] = worst_share(rows, Breakdown::Data);
  if (comm_frac > 0.30) communication_alert(step, comm_frac, comm_rank);
  if (data_frac > 0.05)
    raise({"data_wait", step, data_frac, 0.05,
           fmt::format("waiting for data is {:.0f}% of the step on {}", 100 * data_frac, rank_name(data_rank)),
           fmt::format("raise data.workers (now {}) or data.prefetch (now {})", r.data.workers, r.data.prefetch)});
  size_t strag = 0;  // the rank whose own work has the longest tail this interval
  for (size_t k = 0; k < rows.size(); ++k)
    if (rows[k][kBusyP99] - rows[k][kBusyP50] > rows[strag][kBusyP99] - rows[strag][kBusyP50]) strag = k;
  // A straggler: the step's tail comes from a rank's own work (its busy time has the tail
  // too); a tail of waiting for data is the data_wait alert's.
  // Below 100 steps the P99 is the maximum, and one preempted step is not a straggler. A
  // straggler is slower than its peers: one rank has none (its tail is the machine's noise,
  // and no other node would help), and a tail every rank shares is no one rank's.
  if (rows.size() > 1 && pm.timed >= 100 && p50 > 0 && p99 > 1.5 * p50 &&
      rows[strag][kBusyP99] > 1.5 * rows[strag][kBusyP50] && rows[strag][kBusyP99] > 1.5 * peers_busy_p99(rows, strag)) {
    raise({"straggler", step, p99 / p50, 1.5,
           fmt::format("step time P99 {:.0f} ms is {:.1f}x its P50 {:.0f} ms; the straggler is {} (its own work P99 {:.0f} ms, "
                       "P50 {:.0f} ms)", p99, p99 / p50, p50, rank_name(strag), rows[strag][kBusyP99], rows[strag][kBusyP50]),
           fmt::format("look for another job or a thermal limit on the node of {}; pin its threads (train.threads, "
                       "OMP_PROC_BIND) or move it to another node", rank_name(strag))});
  }
  if (plan_.device_memory > 0 && peak >= 0.95 * plan_.device_memory)
    raise({"memory", step, peak / plan_.device_memory, 0.95,
           fmt::format("peak memory {} is within 5% of the device's {}", format_bytes(peak), format_bytes(plan_.device_memory)),
           "recompute more activations (recompute: auto or full), a smaller batch.micro, ZeRO-1 (parallel.zero: 1) or more "
           "pipeline stages, before a longer sequence or a fragmentation spike runs out of memory"});
  if (util < 0.70)
    raise({"utilization", step, util, 0.70,
           fmt::format("the ranks compute (forward, backward, optimizer) only {:.0f}% of the step", 100 * util),
           "see the breakdown in this record's per_rank: data wait -> data.workers; exposed communication -> the layout; "
           "pipeline idle -> more micro-batches (batch.accum) or the interleaved schedule"});
  if (plan_.pp > 1 && imbalance > 0.10)
    raise({"stage_imbalance", step, imbalance, 0.10,
           fmt::format("pipeline stage {} works {:.0f} ms per step, {:.0f}% more than the least loaded stage", slow_stage,
                       stage_busy[slow_stage], 100 * imbalance / std::max(1e-9, 1 - imbalance)),
           "balance the layers over the stages (fewer layers on the slow stage: the embedding and the output layer sit on the "
           "first and last), or look for a straggler on that stage"});
}

// Exposed communication past the rule of thumb of 30% of the step: with the plan's prediction,
// the alert says what was predicted and names the layout change the search would make (asked
// once, here: the search is not free, and the alert is raised once per run).
void RunMetrics::communication_alert(int64_t step, double share, size_t rank) {
  for (const Alert& a : alerts_)
    if (a.name == "communication") return;
  std::string message = fmt::format("exposed communication is {:.0f}% of the step on {}", 100 * share, rank_name(rank));
  std::string action = fmt::format(
      "change the layout: `runner plan --search` ranks the alternatives by predicted step (now dp {} tp {} pp {}); fewer "
      "tensor-parallel ranks, a larger parallel.bucket_mb, or more micro-batches per step to hide the data-parallel reduction",
      plan_.dp, plan_.tp, plan_.pp);
  if (predicted_) {
    message += fmt::format(" (the plan predicted {:.0f}%)", 100 * predicted_->comm_share());
    if (!advice_ && advise_) advice_ = advise_(share);
    if (advice_ && !advice_->empty()) action = "the layout search's change: " + *advice_ + " (`runner plan --search` lists the rest)";
  }
  raise({"communication", step, share, 0.30, message, action});
}

void RunMetrics::breakdown_table(const std::vector<std::array<double, kRow>>& rows) {
  if (grid_.rank() != 0 || rows.empty() || rows[0][kSteps] <= 0) return;
  log_->info("step-time breakdown, ms per step (steps after the first)");
  log_->info("  {:<22} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8}", "rank", "data", "fwd", "bwd", "optim",
             "comm", "pipe", "lscale", "rollbk", "ckpt", "other", "total");
  size_t slow = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const auto& row = rows[k];
    const double n = std::max(1.0, row[kSteps]);
    parallel::Coords c = parallel::coords_of(grid_.shape(), static_cast<int>(k));
    log_->info("  {:<22} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>7.1f} {:>8.1f}",
               fmt::format("{} (dp{} tp{} pp{})", k, c.dp, c.tp, c.pp), row[0] / n, row[1] / n, row[2] / n, row[3] / n,
               row[4] / n, row[5] / n, row[6] / n, row[7] / n, row[8] / n, row[9] / n, interval_of(row) / n);
    if (busy_of(row) > busy_of(rows[slow])) slow = k;
  }
  if (rows.size() > 1) {
    parallel::Coords c = parallel::coords_of(grid_.shape(), static_cast<int>(slow));
    log_->info("  slowest: rank {} (dp {} tp {} pp {}, stage {}), busy {:.1f} ms per step", slow, c.dp, c.tp, c.pp, c.pp,
               busy_of(rows[slow]) / std::max(1.0, rows[slow][kSteps]));
  }
}

}  // namespace runner
