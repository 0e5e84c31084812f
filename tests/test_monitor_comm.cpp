// The monitor's communication check (runner/observe/metrics.h set_prediction, layout_advice.h):
// step records fed to the monitor on one rank carry the measured exposed-communication share
// beside the plan's predicted one; past 30% the "communication" alert names the layout change
// the search would make, asked once; under 30% there is no alert and the search is never asked;
// through `runner train` on 2 ranks, the trainer predicts its own step and the alert names the change.
// And the advice itself: which layout fields change, the layout the user wrote freed for the
// search (the global batch kept), the plan's own layout never suggested.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/observe/metrics.h"
#include "runner/perf/layout_advice.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

struct Fed {
  std::vector<Alert> alerts;
  std::vector<nlohmann::json> monitors;
  std::string log;
  int asked = 0;        // how often the monitor asked for the layout advice
  double asked_with = 0;
};

// Ten steps of 100 ms, `comm_ms` of them exposed communication, through a one-rank monitor
// with a prediction of 5% communication; monitor records every 5 steps.
Fed feed(double comm_ms) {
  test_support::TempDir dir("monitor_comm");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const Plan plan = make_plan(load_recipe(recipe.string(), {"train.monitor_every=5", "train.log_every=5"}));
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  std::ostringstream out;
  auto log = std::make_shared<spdlog::logger>("monitor_comm", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  Fed fed;
  {
    RunMetrics m(plan, grid, log);
    m.open(dir.string(), -1);
    StepCost predicted;
    predicted.step_s = 0.1;
    predicted.comm_exposed["tp"] = 0.004;
    predicted.comm_exposed["dp"] = 0.001;
    m.set_prediction(predicted, [&fed](double share) {
      fed.asked++;
      fed.asked_with = share;
      return std::string("parallel.tp: 2 -> 1, parallel.dp: 1 -> 2: predicted comm share 4% (now 40%)");
    });
    for (int64_t step = 1; step <= 10; ++step) {
      StepResult s;
      s.loss = 2.0;
      s.norm = 1.0;
      s.total_ms = 100;
      s.comm_exposed_ms = comm_ms;
      s.fwd_ms = (100 - comm_ms) * 0.4;
      s.bwd_ms = (100 - comm_ms) * 0.5;
      s.opt_ms = (100 - comm_ms) * 0.1;
      m.step(step, plan.tokens_per_step, s, 0);
      m.step_line(step, s);
    }
    m.flush_monitor();
    fed.alerts = m.alerts();
  }
  log->flush();
  fed.log = out.str();
  std::ifstream in(dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("monitor")) fed.monitors.push_back(j);
  }
  return fed;
}

const Alert* find(const std::vector<Alert>& alerts, const std::string& name) {
  for (const Alert& a : alerts)
    if (a.name == name) return &a;
  return nullptr;
}

// A candidate of the search with this layout and prediction (its recipe unused here).
SearchCandidate cand(int64_t dp, int64_t tp, int64_t micro, int64_t accum, double step_s, double comm_s) {
  SearchCandidate c;
  c.dp = dp;
  c.tp = tp;
  c.micro = micro;
  c.accum = accum;
  c.schedule = "1f1b";
  c.recompute = "none";
  c.predicted.step_s = step_s;
  c.predicted.comm_exposed["tp"] = comm_s;
  return c;
}

}  // namespace

TEST_CASE("communication past 30% of the step: the alert names the search's layout change, asked once") {
  const Fed fed = feed(40);
  const Alert* a = find(fed.alerts, "communication");
  REQUIRE(a != nullptr);
  CHECK(a->value == doctest::Approx(0.40));
  CHECK(a->message.find("the plan predicted 5%") != std::string::npos);
  CHECK(a->action.find("parallel.tp: 2 -> 1, parallel.dp: 1 -> 2") != std::string::npos);
  CHECK(fed.asked == 1);  // two monitor intervals past 30%, one search
  CHECK(fed.asked_with == doctest::Approx(0.40));
  REQUIRE(fed.monitors.size() == 2);
  for (const auto& j : fed.monitors) {
    CHECK(j["comm_share"]["measured"].get<double>() == doctest::Approx(0.40));
    CHECK(j["comm_share"]["predicted"].get<double>() == doctest::Approx(0.05));
  }
  INFO(fed.log);
  CHECK(fed.log.find("comm 40% (predicted 5%)") != std::string::npos);
}

TEST_CASE("communication under 30%: no alert, the search never asked, both shares still recorded") {
  const Fed fed = feed(20);
  CHECK(find(fed.alerts, "communication") == nullptr);
  CHECK(fed.asked == 0);
  REQUIRE(!fed.monitors.empty());
  CHECK(fed.monitors.back()["comm_share"]["measured"].get<double>() == doctest::Approx(0.20));
  CHECK(fed.monitors.back()["comm_share"]["predicted"].get<double>() == doctest::Approx(0.05));
}

TEST_CASE("the advice: the change from the plan's layout, never the plan's own layout") {
  test_support::TempDir dir("monitor_advice");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const Plan plan = make_plan(load_recipe(recipe.string(), {"parallel.tp=2", "parallel.dp=1"}), 2);
  REQUIRE(plan.tp == 2);
  REQUIRE(plan.micro == 2);
  REQUIRE(plan.accum == 4);
  const SearchCandidate same = cand(1, 2, 2, 4, 0.050, 0.019), dp2 = cand(2, 1, 4, 1, 0.030, 0.0012);
  CHECK(same_layout(plan, same));
  CHECK(!same_layout(plan, dp2));
  CHECK(layout_change(plan, dp2) == "parallel.tp: 2 -> 1, parallel.dp: 1 -> 2, batch.micro: 2 -> 4, batch.accum: 4 -> 1");
  SearchResult res;
  res.candidates = {dp2, same};
  const std::string advice = layout_advice(plan, res, 0.38, 0.05);
  INFO(advice);
  CHECK(advice.rfind("parallel.tp: 2 -> 1, parallel.dp: 1 -> 2", 0) == 0);
  CHECK(advice.find("predicted comm share 4% (now 38%)") != std::string::npos);
  CHECK(advice.find("ranks this layout first") == std::string::npos);
  // The plan's layout ranked first: the next one is named, and the advice says so.
  res.candidates = {same, dp2};
  CHECK(layout_advice(plan, res, 0.38, 0.05).find("ranks this layout first") != std::string::npos);
  res.candidates = {same};
  CHECK(layout_advice(plan, res, 0.38, 0.05).empty());
}

TEST_CASE("the advice searches the layout the user wrote again, with the global batch fixed") {
  test_support::TempDir dir("monitor_advice_recipe");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const Plan plan = make_plan(load_recipe(recipe.string(), {"parallel.tp=2", "recompute.mode=full"}), 2);
  const Recipe r = advice_recipe(plan);
  CHECK(!r.locs.count("parallel.tp"));
  CHECK(!r.locs.count("batch.micro"));
  CHECK(!r.locs.count("recompute.mode"));
  CHECK(r.locs.count("batch.global"));
  CHECK(r.locs.count("model.d_model"));  // the model stays the constraint it was
  CHECK(r.parallel.tp == 1);
  CHECK(r.batch.micro == 0);
  CHECK(r.recompute.mode == RecomputeMode::none);
  CHECK(r.batch.global == 8);
}

TEST_CASE("the advice from the real search: a tp2 run of a small model is told to go data-parallel") {
  test_support::TempDir dir("monitor_advice_search");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const Plan plan = make_plan(load_recipe(recipe.string(), {"parallel.tp=2"}), 2);
  const std::string advice = search_layout_advice(plan, 0.40, 0.05);
  INFO(advice);
  // 2 layers of width 64 on 2 CPU ranks: tensor parallelism's per-layer all-reduces cost more
  // than they save; the search keeps the global batch of 8 and drops tp.
  CHECK(advice.rfind("parallel.tp: 2 -> 1, parallel.dp: 1 -> 2", 0) == 0);
  CHECK(advice.find("(now 40%)") != std::string::npos);
  CHECK(advice.find("predicted comm share") != std::string::npos);
}

TEST_CASE("through runner train: a tp2 run waiting in communication gets the alert naming the search's change") {
  test_support::TempDir dir("monitor_comm_train");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const fs::path run = dir / "run";
  // Rank 1 stalls 60 ms every step, so rank 0 waits in the tensor-parallel all-reduces: exposed
  // communication far past 30% of its step, against a prediction of a few percent.
  const test_support::Result r = test_support::sh(
      "RUNNER_DEBUG_STALL_RANK=1 RUNNER_DEBUG_STALL_EVERY=1 RUNNER_DEBUG_STALL_MS=60 " + test_support::mpirun(2) +
      RUNNER_BINARY + " train " + recipe.string() + " --quiet --run-dir " + run.string() +
      " --set parallel.tp=2 --set train.steps=8 --set train.log_every=4 --set train.monitor_every=4 --set checkpoint.cadence=never"
      " --set checkpoint.every_steps=0");
  INFO(r.out);
  REQUIRE(r.code == 0);
  nlohmann::json alert, monitor;
  for (const nlohmann::json& j : test_support::metrics_records(run)) {
    if (j.contains("alert") && j["alert"] == "communication") alert = j;
    if (j.contains("monitor")) monitor = j;
  }
  REQUIRE(alert.is_object());
  INFO(alert.dump());
  CHECK(alert["value"].get<double>() > 0.30);
  CHECK(alert["message"].get<std::string>().find("the plan predicted") != std::string::npos);
  CHECK(alert["action"].get<std::string>().find("the layout search's change: parallel.tp: 2 -> 1, parallel.dp: 1 -> 2") !=
        std::string::npos);
  REQUIRE(monitor.is_object());
  CHECK(monitor["comm_share"]["measured"].get<double>() > 0.30);
  CHECK(monitor["comm_share"]["predicted"].get<double>() < 0.30);
}
