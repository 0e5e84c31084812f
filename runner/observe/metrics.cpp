// What a run reports (see metrics.h).
#include "runner/observe/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace fs = std::filesystem;

namespace runner {

std::string human_count(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 90) return fmt::format("{:.0f}s", s);
  if (s < 5400) return fmt::format("{:.0f}m", s / 60);
  return fmt::format("{:.1f}h", s / 3600);
}

namespace {

// Keeps the records of steps up to `step` (a torn last line, from a kill, goes too).
void truncate_after(const fs::path& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::ostringstream kept;
  for (std::string line; std::getline(in, line);) {
    try {
      auto j = nlohmann::json::parse(line);
      if (j.contains("summary") || !j.contains("step") || j["step"].get<int64_t>() > step) continue;
    } catch (const nlohmann::json::exception&) {
      continue;  // a line torn by a kill
    }
    kept << line << "\n";
  }
  in.close();
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept.str();
  }
  fs::rename(tmp, path);
}

}  // namespace

RunMetrics::RunMetrics(const Plan& plan, parallel::Grid& grid, std::shared_ptr<spdlog::logger> log)
    : plan_(plan), grid_(grid), log_(std::move(log)) {}

void RunMetrics::open(const std::string& run_dir, int64_t resumed_from) {
  resumed_from_ = resumed_from;
  if (grid_.rank() != 0) return;
  const fs::path path = fs::path(run_dir) / "metrics.jsonl";
  // A resumed run keeps the records up to its checkpoint; a run that starts from step 0 (a
  // fresh directory, or one whose run was killed before its first checkpoint) starts the file over.
  if (resumed_from >= 0) {
    truncate_after(path, resumed_from);
    file_.open(path, std::ios::app);
  } else {
    file_.open(path, std::ios::trunc);
  }
}

void RunMetrics::write(const std::string& line) {
  if (grid_.rank() != 0) return;
  file_ << line << "\n";
  file_.flush();  // one small write per record, so a killed run keeps its history
}

void RunMetrics::measure_memory() {
  auto& mt = ops::MemoryTracker::instance();
  for (int a = 0; a < ops::kAccounts; ++a)
    measured_peak_[a] = std::max(measured_peak_[a], mt.peak(static_cast<ops::Account>(a)));
}

void RunMetrics::step(int64_t step, int64_t tokens, const StepResult& s, double checkpoint_ms) {
  if (step > 1) { sum_ms_ += s.total_ms; timed_++; }  // the first step warms caches
  window_ms_ += s.total_ms;
  window_data_ += s.data_ms;
  window_++;
  const double tps = static_cast<double>(plan_.tokens_per_step) / (s.total_ms / 1e3);
  const double mfu = peak_flops_ > 0 ? plan_.flops_per_token * tps / peak_flops_ : 0;
  const size_t mem = ops::MemoryTracker::instance().peak_total();
  nlohmann::json j{{"step", step},          {"loss", s.loss},           {"lr", s.lr},
                   {"grad_norm", s.norm},      {"tokens", tokens},      {"tokens_per_s", tps},
                   {"mfu", mfu},               {"step_ms", s.total_ms},    {"data_ms", s.data_ms},
                   {"forward_ms", s.fwd_ms},   {"backward_ms", s.bwd_ms},  {"optimizer_ms", s.opt_ms},
                   {"comm_exposed_ms", s.comm_exposed_ms},     {"comm_hidden_ms", s.comm_hidden_ms},
                   {"pipeline_wait_ms", s.pipe_wait_ms},
                   {"peak_bytes", mem},        {"skipped", s.skipped}};
  // The coarse breakdown, its windows for the monitor, and the spike alerts.
  const Breakdown b = Breakdown::of(s);
  nlohmann::json bj = nlohmann::json::object();
  for (int p = 0; p < Breakdown::kParts; ++p) bj[Breakdown::name(p)] = b.ms[static_cast<size_t>(p)];
  j["breakdown"] = bj;
  j["interval_ms"] = b.interval();
  add_breakdown(step, s, b);
  spike_alerts(step, s);
  pipe_wait_total_ += s.pipe_wait_ms;
  step_ms_total_ += s.total_ms;
  comm_hidden_total_ += s.comm_hidden_ms;
  comm_exposed_total_ += s.comm_exposed_ms;
  j["checkpoint_ms"] = checkpoint_ms;
  j["loss_scale"] = s.scale;
  if (s.overflow) {
    overflows_++;
    j["overflow"] = true;
    j["overflow_tensor"] = s.overflow_tensor;
  }
  if (s.diagnostics) grad_range(step, *s.diagnostics, j);
  write(j.dump());
}

// The step's parts into the monitor's window and the run's totals (the first step warms caches
// and stays out).
void RunMetrics::add_breakdown(int64_t step, const StepResult& s, const Breakdown& b) {
  checkpoint_total_ += b.ms[Breakdown::Checkpoint];
  if (s.skipped) skipped_++;
  if (step <= 1) return;
  for (int p = 0; p < Breakdown::kParts; ++p) {
    window_parts_[static_cast<size_t>(p)] += b.ms[static_cast<size_t>(p)];
    total_parts_[static_cast<size_t>(p)] += b.ms[static_cast<size_t>(p)];
  }
  window_steps_++;
  total_steps_++;
  step_times_.push_back(s.total_ms);
  busy_times_.push_back(b.busy());
  window_busy_.push_back(b.busy());
}

// A loss or gradient norm far above its running mean raises its alert (once per run).
void RunMetrics::spike_alerts(int64_t step, const StepResult& s) {
  if (s.skipped || !std::isfinite(s.loss) || !std::isfinite(s.norm)) return;
  if (ema_steps_ >= 20 && loss_ema_ > 0 && s.loss > 2 * loss_ema_)
    raise({"loss_spike", step, s.loss / loss_ema_, 2.0,
           fmt::format("loss {:.4f} is {:.1f}x its running mean {:.4f}", s.loss, s.loss / loss_ema_, loss_ema_),
           "look at the batch of this step (a corrupt or out-of-distribution sample); a lower optimizer.lr or a longer "
           "warm-up; checkpoint.spike_threshold rolls such steps back automatically"});
  if (ema_steps_ >= 20 && norm_ema_ > 0 && s.norm > 5 * norm_ema_)
    raise({"grad_norm_spike", step, s.norm / norm_ema_, 5.0,
           fmt::format("gradient norm {:.3g} is {:.1f}x its running mean {:.3g}", s.norm, s.norm / norm_ema_, norm_ema_),
           fmt::format("set or lower optimizer.grad_clip (now {:g}); check this step's batch; a lower optimizer.lr",
                       plan_.recipe.optimizer.grad_clip)});
  loss_ema_ = ema_steps_ ? 0.9 * loss_ema_ + 0.1 * s.loss : s.loss;
  norm_ema_ = ema_steps_ ? 0.9 * norm_ema_ + 0.1 * s.norm : s.norm;
  ema_steps_++;
}

// precision.diagnostics: the per-tensor gradient range into the step's record `j`, and a
// warning (once) when no single fp16 loss scale suits every tensor.
void RunMetrics::grad_range(int64_t step, const GradReport& r, nlohmann::json& j) {
  nlohmann::json t = nlohmann::json::array();
  for (const GradRange& g : r.tensors)
    t.push_back({{"tensor", g.name},
                 {"max_abs", g.max_abs},
                 {"underflow_fraction", g.underflow},
                 {"zero_fraction", g.numel ? static_cast<double>(g.zeros) / static_cast<double>(g.numel) : 0.0},
                 {"nonfinite", g.nonfinite},
                 {"headroom_bits", std::isfinite(g.headroom_bits) ? nlohmann::json(g.headroom_bits) : nlohmann::json(nullptr)},
                 {"scale_range", {g.scale_lo, std::isfinite(g.scale_hi) ? nlohmann::json(g.scale_hi) : nlohmann::json(nullptr)}}});
  j["grad_range"] = t;
  if (r.conflict()) {
    const GradRange &a = r.tensors[static_cast<size_t>(r.needs_large)], &b = r.tensors[static_cast<size_t>(r.needs_small)];
    j["scale_conflict"] = {a.name, b.name};
    if (!conflict_warned_)
      log_->warn("step {}: no single fp16 loss scale suits every gradient: {} needs a scale of at least {:.3g} "
                 "(else more than 1% of its norm flushes to zero), but {} overflows above {:.3g}. Consider bf16 "
                 "(fp32's exponent range), or fp32 for the tensors at the extremes",
                 step, describe_tensor(a), a.scale_lo, describe_tensor(b), b.scale_hi);
    conflict_warned_ = true;
  }
  last_range_ = r;
}

bool RunMetrics::logged(int64_t step) const {
  return step % plan_.recipe.train.log_every == 0 || step == plan_.recipe.train.steps || step == 1;
}

int64_t RunMetrics::monitor_interval() const {
  const TrainConfig& t = plan_.recipe.train;
  if (t.monitor_every > 0) return t.monitor_every;
  return t.log_every * ((100 + t.log_every - 1) / t.log_every);
}

void RunMetrics::step_line(int64_t step, const StepResult& s) {
  print_step_line(step, s);
  // The interval's gather, started a step line ago, is done: its record and line now, not an
  // interval late.
  if (pending_ && logged(step)) flush_monitor();
  // At its own interval: a monitor line after every step line doubled the console at a small log_every.
  if (step % monitor_interval() == 0 || step == plan_.recipe.train.steps) monitor(step);
}

void RunMetrics::print_step_line(int64_t step, const StepResult& s) {
  const int64_t total = plan_.recipe.train.steps;
  if (!logged(step)) return;
  const double tok_per_step = static_cast<double>(plan_.tokens_per_step);
  const double avg = window_ms_ / static_cast<double>(window_);
  const double eta = static_cast<double>(total - step) * (timed_ ? sum_ms_ / static_cast<double>(timed_) : avg) / 1e3;
  const size_t mem = ops::MemoryTracker::instance().peak_total();
  log_->info("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} ms | {} tok/s | MFU {:.0f}% | data {:.1f} ms | mem {} | ETA {}",
             step, std::to_string(total).size(), total, s.loss, s.lr, s.norm, avg,
             human_count(tok_per_step / (avg / 1e3)),
             100 * plan_.flops_per_token * tok_per_step / (avg / 1e3) / std::max(1.0, peak_flops_),
             window_data_ / static_cast<double>(window_), format_bytes(static_cast<double>(mem)), human_duration(eta));
  if (scaler_active_) log_->info("  loss scale {:g} | {} step(s) skipped on overflow so far", s.scale, overflows_);
  // An impossible MFU is said when first printed, not only in the summary a stopped run never
  // reaches (the first step warms caches and is not judged).
  const double mfu = plan_.flops_per_token * tok_per_step / (avg / 1e3) / std::max(1.0, peak_flops_);
  if (mfu > 1.0 && step > 1 && !mfu_warned_) {
    mfu_warned_ = true;
    mfu_line(mfu);
  }
  window_ = 0;
  window_ms_ = window_data_ = 0;
}

void RunMetrics::eval(int64_t step, const EvalResult& e) {
  if (grid_.rank() != 0) return;
  nlohmann::json j{{"eval", true}, {"step", step}, {"val_loss", e.loss}};
  if (e.accuracy >= 0) {
    j["accuracy"] = e.accuracy;
    log_->info("eval step {} | val loss {:.4f} | addition exact-match {:.1f}% of {} held-out problems", step, e.loss,
               100 * e.accuracy, e.problems);
  } else {
    // Text and token data: perplexity, exp of the mean held-out loss per token (nats).
    j["val_ppl"] = std::exp(e.loss);
    log_->info("eval step {} | val loss {:.4f} | val ppl {:.2f}", step, e.loss, std::exp(e.loss));
  }
  write(j.dump());
}

void RunMetrics::rollback(int64_t step, int64_t to_step, double loss) {
  nlohmann::json j{{"rollback", true}, {"step", step}, {"to_step", to_step}, {"loss", loss}};
  write(j.dump());
}

// The last gradient range report: the tensors closest to overflow and those losing most to
// underflow at the run's scale.
void RunMetrics::summarize_range(const GradReport& r) {
  std::vector<const GradRange*> t;
  for (const GradRange& g : r.tensors)
    if (g.numel > 0) t.push_back(&g);
  if (t.empty()) return;
  log_->info("gradient range at the last logged step (loss scale {:g}; fp16 overflows above 65504, flushes below 2^-24)", r.scale);
  log_->info("  {:<32} {:>11} {:>10} {:>10}", "tensor", "max |grad|", "headroom", "underflow");
  auto row = [&](const GradRange* g) {
    log_->info("  {:<32} {:>11.3e} {:>7.1f} b {:>9.3f}%", g->name, g->max_abs, g->headroom_bits, 100 * g->underflow);
  };
  std::sort(t.begin(), t.end(), [](auto* a, auto* b) { return a->headroom_bits < b->headroom_bits; });
  for (size_t i = 0; i < std::min<size_t>(3, t.size()); ++i) row(t[i]);
  std::sort(t.begin(), t.end(), [](auto* a, auto* b) { return a->underflow > b->underflow; });
  for (size_t i = 0; i < std::min<size_t>(3, t.size()); ++i) row(t[i]);
  if (r.conflict())
    log_->warn("  no single loss scale suits both {} and {}", describe_tensor(r.tensors[static_cast<size_t>(r.needs_large)]),
               describe_tensor(r.tensors[static_cast<size_t>(r.needs_small)]));
}

void RunMetrics::summary(int64_t steps, int64_t tokens, const EvalResult& e, double wall_s,
                         std::vector<ops::OpProfile> prof) {
  flush_monitor();  // the last interval's record
  const Recipe& r = plan_.recipe;
  // Pipeline idle time per stage, measured (time blocked on neighbours) against the plan's bubble.
  std::vector<double> idle(static_cast<size_t>(plan_.pp), 0.0);
  if (grid_.coords().dp == 0 && grid_.coords().tp == 0 && step_ms_total_ > 0)
    idle[static_cast<size_t>(grid_.coords().pp)] = pipe_wait_total_ / step_ms_total_;
  grid_.world().allreduce_sum(idle.data(), static_cast<int64_t>(idle.size()));
  // The breakdown per rank over the whole run, gathered on rank 0.
  auto ranks = gather(total_parts_, total_steps_);
  double hidden_frac = comm_hidden_total_ + comm_exposed_total_ > 0
                           ? comm_hidden_total_ / (comm_hidden_total_ + comm_exposed_total_) : 0.0;
  if (grid_.rank() != 0) return;
  if (plan_.pp > 1)
    for (int64_t sidx = 0; sidx < plan_.pp; ++sidx)
      log_->info("pipeline stage {}: idle {:.1f}% of the step (plan bubble {:.1f}%)", sidx, 100 * idle[static_cast<size_t>(sidx)],
                 100 * plan_.bubble);
  if (plan_.dp > 1)
    log_->info("data-parallel gradients: {:.0f} ms communication hidden behind backward, {:.0f} ms exposed ({:.0f}% hidden)",
               comm_hidden_total_, comm_exposed_total_, 100 * hidden_frac);
  breakdown_table(ranks);
  const double avg_ms = mean_step_ms();
  double tps = avg_ms > 0 ? plan_.tokens_per_step / (avg_ms / 1e3) : 0;
  const double mfu = plan_.flops_per_token * tps / std::max(1.0, peak_flops_);
  // A resumed job trained only the steps after its checkpoint, in the wall time it reports.
  const std::string done = resumed_from_ > 0 && resumed_from_ < steps
                               ? fmt::format("{} steps ({}-{} in this job)", steps, resumed_from_ + 1, steps)
                               : fmt::format("{} steps", steps);
  log_->info("done: {} in {} | {} tok/s | MFU {:.0f}% | final val loss {:.4f}{}", done, human_duration(wall_s),
             human_count(tps), 100 * mfu, e.loss,
             e.accuracy >= 0 ? fmt::format(" | accuracy {:.1f}%", 100 * e.accuracy)
                             : fmt::format(" | val ppl {:.2f}", std::exp(e.loss)));
  mfu_line(mfu);
  if (scaler_active_)
    log_->info("fp16 loss scale: {:g} at the end | {} overflowed step(s) skipped", scaler_.scale, scaler_.skipped_steps);
  if (last_range_) summarize_range(*last_range_);
  nlohmann::json ledger = ledger_json();
  nlohmann::json ops_json = top_ops_json(std::move(prof));
  nlohmann::json j{{"summary", true},  {"steps", steps},          {"tokens", tokens},
                   {"tokens_per_s", tps}, {"wall_s", wall_s},       {"val_loss", e.loss},
                   {"ledger", ledger}, {"top_ops", ops_json},       {"peak_flops", peak_flops_},
                   {"mfu", mfu},       {"peak_kind", peak_kind_},   {"peak_source", peak_source_}};
  if (e.accuracy >= 0) j["accuracy"] = e.accuracy;
  else j["val_ppl"] = std::exp(e.loss);
  if (resumed_from_ > 0) j["resumed_from"] = resumed_from_;  // wall_s is this job's, from there
  if (scaler_active_) j["loss_scale"] = {{"final", scaler_.scale}, {"skipped_steps", scaler_.skipped_steps}};
  if (last_range_) j["scale_conflict"] = last_range_->conflict();
  j["layout"] = {{"world", grid_.world_size()}, {"dp", plan_.dp}, {"tp", plan_.tp}, {"pp", plan_.pp},
                 {"zero", r.parallel.zero}, {"schedule", to_string(r.parallel.schedule)}};
  j["comm_hidden_ms"] = comm_hidden_total_;
  j["comm_exposed_ms"] = comm_exposed_total_;
  j["comm_hidden_fraction"] = hidden_frac;
  j["pipeline_idle_fraction"] = idle;
  j["plan_bubble"] = plan_.bubble;
  j["breakdown_per_rank"] = per_rank_json(ranks);
  j["step_ms"] = step_ms_percentiles();
  j["skipped_steps"] = skipped_;
  j["checkpoint_ms"] = checkpoint_total_;
  nlohmann::json al = nlohmann::json::array();
  for (const Alert& a : alerts_) al.push_back(a.name);
  j["alerts"] = al;
  write(j.dump());
}

// What the run's MFU is against; above 100% the peak is plainly too low, and the user is told
// how to get a better one.
void RunMetrics::mfu_line(double mfu) {
  if (peak_source_.empty()) return;
  log_->info("MFU is against {:.1f} GFLOP/s: {}", peak_flops_ / 1e9, peak_source_);
  if (mfu <= 1.0) return;
  const bool host = peak_kind_ == "cached" || peak_kind_ == "measured";
  const bool wide = plan_.recipe.precision.compute != FloatFormat::fp32;
  log_->warn("MFU {:.0f}% is above 100%: the peak it is against is too low{}", 100 * mfu,
             !host ? "; give the device's real figure in hardware.peak_tflops"
             : wide ? ": it is the fp32 sgemm peak, which a 16-bit run on oneDNN's path (AMX) can pass; give hardware.peak_tflops "
                      "the 16-bit figure of this CPU"
                    : " (measured while the machine was busy?); re-measure it on a quiet machine with RUNNER_PEAK_CACHE=refresh, "
                      "or give hardware.peak_tflops");
}

// Ledger honesty (docs/invariants.md, invariant 4): this rank's measured peak of each account
// beside the plan's prediction, logged and returned for the summary record.
nlohmann::json RunMetrics::ledger_json() {
  const StageLedger& L = plan_.stages[static_cast<size_t>(grid_.coords().pp)];
  std::pair<const char*, std::pair<double, ops::Account>> rows[] = {
      {"parameters", {L.parameters, ops::Account::Parameters}},
      {"gradients", {L.gradients, ops::Account::Gradients}},
      {"optimizer", {L.optimizer, ops::Account::Optimizer}},
      {"activations", {L.activations, ops::Account::Activations}},
      {"workspace", {L.workspace, ops::Account::Workspace}},
      {"communication", {L.communication, ops::Account::Communication}}};
  nlohmann::json ledger = nlohmann::json::object();
  log_->info("memory ledger      predicted     measured");
  for (auto& [name, pa] : rows) {
    double measured = static_cast<double>(measured_peak_[static_cast<int>(pa.second)]);
    log_->info("  {:<14} {:>12} {:>12}", name, format_bytes(pa.first), format_bytes(measured));
    ledger[name] = {{"predicted", pa.first}, {"measured", measured}};
  }
  return ledger;
}

// The operators by time, largest first, logged and returned for the summary record.
nlohmann::json RunMetrics::top_ops_json(std::vector<ops::OpProfile> prof) {
  std::sort(prof.begin(), prof.end(), [](const ops::OpProfile& a, const ops::OpProfile& b) {
    return a.forward_ms + a.backward_ms + a.recompute_ms > b.forward_ms + b.backward_ms + b.recompute_ms;
  });
  double total_op = 0;
  for (auto& p : prof) total_op += p.forward_ms + p.backward_ms + p.recompute_ms;
  nlohmann::json ops_json = nlohmann::json::array();
  log_->info("top operators      forward   backward  recompute   share");
  for (auto& p : prof) {
    double t = p.forward_ms + p.backward_ms + p.recompute_ms;
    log_->info("  {:<14} {:>8.0f}ms {:>8.0f}ms {:>8.0f}ms {:>6.1f}%", p.name, p.forward_ms, p.backward_ms,
               p.recompute_ms, 100 * t / std::max(1e-9, total_op));
    ops_json.push_back({{"op", p.name}, {"forward_ms", p.forward_ms}, {"backward_ms", p.backward_ms},
                        {"recompute_ms", p.recompute_ms}, {"calls", p.calls}});
  }
  return ops_json;
}

// The breakdown per rank over the whole run (rows gathered on rank 0), per step.
nlohmann::json RunMetrics::per_rank_json(const std::vector<std::array<double, kRow>>& ranks) const {
  nlohmann::json br = nlohmann::json::array();
  for (size_t k = 0; k < ranks.size(); ++k) {
    nlohmann::json rj{{"rank", k}, {"stage", ranks[k][Breakdown::kParts + 3]}, {"steps", ranks[k][Breakdown::kParts]}};
    const double n = std::max(1.0, ranks[k][Breakdown::kParts]);
    for (int p = 0; p < Breakdown::kParts; ++p) rj[Breakdown::name(p)] = ranks[k][static_cast<size_t>(p)] / n;
    br.push_back(rj);
  }
  return br;
}

// The step times' percentiles over the run (nearest rank).
nlohmann::json RunMetrics::step_ms_percentiles() const {
  auto pct = [&](double q) {
    std::vector<double> v = step_times_;
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(std::max(0.0, std::ceil(q * static_cast<double>(v.size())) - 1)))];
  };
  return {{"p50", pct(0.5)}, {"p90", pct(0.9)}, {"p99", pct(0.99)}, {"max", pct(1.0)}};
}

}  // namespace runner
