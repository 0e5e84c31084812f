// The tracer: one profiled step attempt at a time (a rolled-back attempt keeps its own trace
// entry), its spans filed by StepSpans under the attempt they began in.
#include "runner/observe/trace.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "ops/peak.h"

namespace fs = std::filesystem;

namespace runner {

void add_ops(std::vector<ops::OpProfile>& into, const std::vector<ops::OpProfile>& a, const std::vector<ops::OpProfile>& b) {
  for (const ops::OpProfile& p : a) {
    ops::OpProfile d = p;
    for (const ops::OpProfile& q : b)
      if (q.name == p.name) {
        d.forward_ms -= q.forward_ms;
        d.backward_ms -= q.backward_ms;
        d.recompute_ms -= q.recompute_ms;
        d.calls -= q.calls;
      }
    auto it = std::find_if(into.begin(), into.end(), [&](const ops::OpProfile& x) { return x.name == d.name; });
    if (it == into.end()) it = into.insert(into.end(), ops::OpProfile{d.name, 0, 0, 0, 0});
    it->forward_ms += d.forward_ms;
    it->backward_ms += d.backward_ms;
    it->recompute_ms += d.recompute_ms;
    it->calls += d.calls;
  }
}

void Tracer::resumed_at(int64_t step) {
  if (!window_.on() || step < window_.from) return;
  if (step >= window_.to) window_ = {};
  else window_.from = step + 1;
}

void Tracer::measure_roofline(double job_peak_flops) {
  if (!window_.on()) return;
  roofline_.peak_flops = job_peak_flops / static_cast<double>(grid_.world_size());
  roofline_.bandwidth = ops::measure_cpu_memory_bandwidth();
  double bw = roofline_.bandwidth;
  grid_.world().allreduce_sum(&bw, 1);
  roofline_.bandwidth = bw / static_cast<double>(grid_.world_size());
}

// Operators, communicators, pipeline and the loop's own phases report to the attempt until
// end() (after its checkpoint work).
void Tracer::begin(int64_t step, TracedModel& model) {
  if (!window_.covers(step)) return;
  model_ = &model;
  recording_ = true;
  before_ = model.profile();
  steps_.push_back({step, StepTimer::now(), 0, {}, {}, {}});
  model.set_trace(&steps_.back().ops);
  spans_.set_current(static_cast<int64_t>(steps_.size()) - 1);
  timer_.trace_to(&spans_);
  comm_before_.clear();
  for (parallel::Communicator* c : grid_.comms()) comm_before_.push_back(c->counts());
  grid_.set_trace(&spans_);
  model.set_pipeline_trace(&spans_);
}

void Tracer::step_done(double step_ms) {
  if (!recording_) return;
  steps_.back().t1_ns = StepTimer::now();
  model_->set_trace(nullptr);
  add_ops(ops_, model_->profile(), before_);
  steps_ms_ += step_ms;
}

bool Tracer::end(int64_t step) {
  if (!recording_) return false;
  grid_.set_trace(nullptr);
  model_->set_pipeline_trace(nullptr);
  model_->set_trace(nullptr);
  timer_.trace_to(nullptr);
  spans_.set_current(-1);
  std::vector<parallel::Communicator*> comms = grid_.comms();
  for (size_t i = 0; i < comms.size(); ++i)
    for (int k = 0; k < parallel::kCommOps; ++k) {
      const int64_t n = comms[i]->counts()[static_cast<size_t>(k)] - comm_before_[i][static_cast<size_t>(k)];
      if (n > 0)
        steps_.back().calls[fmt::format("{} {}", comms[i]->name(), parallel::comm_op_name(static_cast<parallel::CommOp>(k)))] += n;
    }
  recording_ = false;
  return step == window_.to;
}

void Tracer::write(const std::string& run_dir, int64_t micro_per_step, spdlog::logger* log) {
  const int64_t steps = window_.to - window_.from + 1;
  auto figures = op_figures(model_->graphs(), micro_per_step * steps, ops_);
  nlohmann::json j = profile_json(figures, window_, steps_ms_, roofline_, log);
  j["rank"] = grid_.rank();
  j["grid"] = grid_.name();
  for (size_t i = 0; i < steps_.size(); ++i) steps_[i].spans = spans_.take(static_cast<int64_t>(i));
  j["communication"] = comm_calls_json(steps_);
  std::ofstream(fs::path(run_dir) / fmt::format("profile.rank{}.json", grid_.rank())) << j.dump(2) << "\n";
  if (grid_.rank() == 0) std::ofstream(fs::path(run_dir) / "profile.json") << j.dump(2) << "\n";
  write_traces(run_dir);
}

// trace.rankR.json per rank; rank 0 then merges them into trace.json (one pid per rank).
void Tracer::write_traces(const std::string& run_dir) {
  const fs::path dir = run_dir;
  const bool lead = grid_.rank() == 0;
  // One time base for every rank (the steady clock is the host's): rank 0's first profiled
  // step starts at 0 (ns since boot fit a double exactly).
  double origin = lead && !steps_.empty() ? static_cast<double>(steps_.front().t0_ns) : 0;
  grid_.world().allreduce_sum(&origin, 1);
  std::ofstream(dir / fmt::format("trace.rank{}.json", grid_.rank()))
      << trace_json(steps_, grid_.rank(), grid_.name(), static_cast<int64_t>(origin)).dump() << "\n";
  steps_.clear();
  double done = 1;
  grid_.world().allreduce_sum(&done, 1);  // every rank's file is written
  if (!lead) return;
  nlohmann::json merged = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
  for (int rk = 0; rk < grid_.world_size(); ++rk) {
    std::ifstream in(dir / fmt::format("trace.rank{}.json", rk));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) continue;
    for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(std::move(e));
  }
  std::ofstream(dir / "trace.json") << merged.dump() << "\n";
}

}  // namespace runner
