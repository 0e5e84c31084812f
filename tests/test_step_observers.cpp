// The step loop's observers on their own, without a run: the step timer (one clock read per
// phase feeds the breakdown's milliseconds and, only while a profiled step is recorded, the
// trace), the tracer (a step outside the window is not recorded; inside it, the timer's phases
// land in that step's trace and the model reports to it; end() says when the window is
// over; write() leaves the profile and the merged trace), and the fault hook (inactive without
// its variables; each fault fires at its step only, the NaN once).
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/tensor.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/observe/step_timer.h"
#include "runner/observe/trace.h"
#include "runner/train/fault_hook.h"
#include "tests/support/device.h"
#include "tests/support/env.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

struct Recorder : ops::TraceSink {
  std::vector<ops::TraceSpan> spans;
  void span(const ops::TraceSpan& s) override { spans.push_back(s); }
};

// A model with one operator kind that "runs" 2 ms per step (no graph, so no node events).
struct FakeModel : TracedModel {
  std::vector<ops::TraceEvent>* events = nullptr;
  ops::TraceSink* pipeline = nullptr;
  ops::OpProfile times{"matmul", 0, 0, 0, 0};
  void set_trace(std::vector<ops::TraceEvent>* sink) override { events = sink; }
  void set_pipeline_trace(ops::TraceSink* sink) override { pipeline = sink; }
  std::vector<ops::OpProfile> profile() const override { return {times}; }
  std::vector<const ops::Graph*> graphs() const override { return {}; }
  void step() {
    times.forward_ms += 2;
    times.calls += 1;
  }
};

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("runner_test_observers_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST_CASE("step timer: a phase's milliseconds always, its span only while a sink is set") {
  StepTimer timer;
  Recorder rec;
  const int64_t t0 = StepTimer::now();
  CHECK(timer.span("data wait", "data", t0, t0 + 1500000) == doctest::Approx(1.5));
  CHECK(rec.spans.empty());
  timer.trace_to(&rec);
  CHECK(timer.span("optimizer step", "optimizer", t0, t0 + 2000000) == doctest::Approx(2.0));
  CHECK(timer.phase("zero gradients", "optimizer", t0) >= 0);
  timer.trace_to(nullptr);
  timer.phase("gradient norm", "optimizer", t0);
  REQUIRE(rec.spans.size() == 2);
  CHECK(rec.spans[0].name == "optimizer step");
  CHECK(std::string(rec.spans[0].cat) == "optimizer");
  CHECK(rec.spans[0].t0_ns == t0);
  CHECK(rec.spans[0].t1_ns == t0 + 2000000);
  CHECK(rec.spans[1].name == "zero gradients");
  CHECK(rec.spans[1].t1_ns >= t0);
}

TEST_CASE("tracer: only the window's steps are recorded, with the timer's phases; the files after the last") {
  TempDir dir;
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  StepTimer timer;
  FakeModel model;
  {
    Tracer tracer(grid, timer);
    tracer.set_window({2, 3});
    for (int64_t step = 1; step <= 4; ++step) {
      tracer.begin(step, model);
      CHECK((model.events != nullptr) == (step == 2 || step == 3));
      CHECK((model.pipeline != nullptr) == (step == 2 || step == 3));
      const int64_t t = StepTimer::now();
      model.step();
      timer.phase("data wait", "data", t);
      tracer.step_done(1.0);
      CHECK(model.events == nullptr);  // the step's operators end with its passes
      timer.phase("checkpoint save", "checkpoint", t);  // still the step's, until end()
      const bool last = tracer.end(step);
      CHECK(last == (step == 3));
      CHECK(model.pipeline == nullptr);
      if (last) tracer.write(dir.path.string(), 1, nullptr);
    }
  }
  std::ifstream in(dir.path / "trace.json");
  nlohmann::json trace = nlohmann::json::parse(in);
  std::vector<std::string> phases;
  std::vector<int64_t> steps;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["tid"] == 2) phases.push_back(e["name"].get<std::string>() + "@" + std::to_string(e["args"]["step"].get<int64_t>()));
    if (e["tid"] == 0) steps.push_back(e["args"]["step"]);
  }
  CHECK(steps == std::vector<int64_t>{2, 3});
  CHECK(phases == std::vector<std::string>{"data wait@2", "checkpoint save@2", "data wait@3", "checkpoint save@3"});
  CHECK(fs::exists(dir.path / "trace.rank0.json"));
  std::ifstream pin(dir.path / "profile.json");
  nlohmann::json profile = nlohmann::json::parse(pin);
  CHECK(profile["rank"] == 0);
  CHECK(profile["communication"]["per_step"].size() == 2);
}

TEST_CASE("tracer: a resume inside the window profiles the rest of it, past it nothing") {
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  StepTimer timer;
  Tracer a(grid, timer), b(grid, timer), c(grid, timer);
  a.set_window({4, 6});
  a.resumed_at(5);
  CHECK(a.window().from == 6);
  CHECK(a.window().to == 6);
  b.set_window({4, 6});
  b.resumed_at(6);
  CHECK(!b.window().on());
  c.set_window({4, 6});
  c.resumed_at(2);
  CHECK(c.window().from == 4);
}

TEST_CASE("fault hook: inactive without its variables; each fault at its step only") {
  for (const char* v : {"RUNNER_FAULT_FAIL_RANK", "RUNNER_FAULT_FAIL_STEP", "RUNNER_FAULT_NAN_STEP", "RUNNER_FAULT_INF_STEP",
                        "RUNNER_FAULT_INF_COUNT", "RUNNER_FAULT_NOISE_STEP", "RUNNER_FAULT_STEP_SLEEP_MS",
                        "RUNNER_DEBUG_STALL_RANK", "RUNNER_DEBUG_STALL_EVERY", "RUNNER_DEBUG_STALL_MS"})
    ::unsetenv(v);
  test_support::reload_knobs();
  CHECK(!FaultHook(0).active());

  auto hooks = [] {
    test_support::ScopedEnv fail_rank("RUNNER_FAULT_FAIL_RANK", "1");
    test_support::ScopedEnv fail_step("RUNNER_FAULT_FAIL_STEP", "7");
    test_support::ScopedEnv nan_step("RUNNER_FAULT_NAN_STEP", "3");
    test_support::ScopedEnv noise_step("RUNNER_FAULT_NOISE_STEP", "4");
    return std::make_pair(FaultHook(0), FaultHook(1));
  };
  auto [rank0, rank1] = hooks();
  CHECK(rank1.active());
  CHECK_NOTHROW(rank0.before_passes(7));
  CHECK_NOTHROW(rank1.before_passes(6));
  CHECK_THROWS_AS(rank1.before_passes(7), std::runtime_error);

  test_support::test_device();  // on the strict device the gradient is device memory: the hook writes through a crossing
  ParamSet ps;
  ps.grads.emplace_back(std::vector<int64_t>{4}, ops::DType::F32, ops::Account::Gradients);
  test_support::set_values(ps.grads[0], {0, 0, 0, 0});
  double loss = 1;
  rank0.after_grads(2, loss, ps);
  CHECK(loss == 1);
  rank0.after_grads(3, loss, ps);
  CHECK(std::isnan(loss));
  CHECK(std::isnan(test_support::host_values(ps.grads[0])[0]));
  loss = 1;
  rank0.after_grads(3, loss, ps);  // a rollback's retry of the step runs clean
  CHECK(loss == 1);

  Batch b;
  b.tokens.assign(8, 1);
  b.targets.assign(8, 2);
  std::vector<Batch> mbs{b};
  rank0.batches_ready(3, mbs, 50);
  CHECK(mbs[0].tokens == b.tokens);
  rank0.batches_ready(4, mbs, 50);
  CHECK(mbs[0].tokens != b.tokens);
  for (int32_t t : mbs[0].tokens) CHECK((t >= 0 && t < 50));
}

// The pace file: each step sleeps what the file holds now (a harness slows a run down while a node
// is away, tests/slurm/nodes.sh), the fixed RUNNER_FAULT_STEP_SLEEP_MS when the file is missing.
TEST_CASE("fault hook: RUNNER_FAULT_STEP_SLEEP_FILE sets each step's extra time as the file says at that step") {
  test_support::TempDir dir("pace");
  const std::string pace = dir.file("pace");
  FaultHook hook = [&] {
    test_support::ScopedEnv file("RUNNER_FAULT_STEP_SLEEP_FILE", pace);
    test_support::ScopedEnv ms("RUNNER_FAULT_STEP_SLEEP_MS", "120");
    return FaultHook(0);
  }();
  CHECK(hook.active());
  auto step_ms = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    hook.after_step();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  CHECK(step_ms() >= 120);  // no file yet: the fixed sleep
  std::ofstream(pace) << 250;
  CHECK(step_ms() >= 250);
  std::ofstream(pace) << 0;
  CHECK(step_ms() < 120);  // changed while the run goes on: read again at every step
}
