// Coarse profiling and monitoring, through the real binary: the step-time breakdown in
// metrics.jsonl adds up to the step (one rank, and dp2, tp2, pp2 under mpirun), the monitor
// records and the end-of-run table per rank, and every alert fires on a run made to trigger
// it (a slow data source, a stalled rank, a corrupt batch, a tight memory limit) and none on
// the quickstart.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/graph.h"
#include "runner/model/gpt.h"
#include "runner/plan/plan.h"
#include "runner/plan/plan_internal.h"
#include "runner/recipe/recipe.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using test_support::kLayoutRecipe;
using test_support::Result;
using test_support::sh;

namespace {

const test_support::TempDir kScratch("test_monitor");
const fs::path& kDir = kScratch.path;

const char* const kParts[] = {"data_ms",         "forward_ms",       "backward_ms",   "optimizer_ms", "comm_exposed_ms",
                              "pipeline_idle_ms", "loss_scale_ms",    "rollback_ms",   "checkpoint_ms", "other_ms"};

std::string layout_recipe() {
  static const fs::path p = test_support::write_layout_recipe(kDir);
  return p.string();
}

struct Run {
  Result r;
  std::vector<nlohmann::json> steps, monitors, alerts;
  nlohmann::json summary;
  int count(const std::string& alert) const {
    int n = 0;
    for (auto& a : alerts) n += a["alert"] == alert;
    return n;
  }
};

// Trains `recipe` into kDir/name (np 0: one plain process) with `env` before the command.
Run train(const std::string& name, int np, const std::string& recipe, const std::string& sets, const std::string& env = "") {
  const fs::path dir = kDir / name;
  fs::remove_all(dir);
  std::string cmd = env + " " + test_support::launcher(np) + RUNNER_BINARY + " train " + recipe + " --quiet --run-dir " +
                    dir.string() + " " + sets;
  Run run;
  run.r = sh(cmd);
  INFO(cmd << "\n" << run.r.out);
  REQUIRE(run.r.code == 0);
  for (const nlohmann::json& j : test_support::metrics_records(dir)) {
    if (j.contains("summary")) run.summary = j;
    else if (j.contains("monitor")) run.monitors.push_back(j);
    else if (j.contains("alert")) run.alerts.push_back(j);
    else if (j.contains("breakdown")) run.steps.push_back(j);
  }
  return run;
}

// Every step record after the first: the named parts (all but `other`) sum to the measured
// step (plus the checkpoint and rollback work since the last record) within 5%.
void check_breakdown(const Run& run) {
  REQUIRE(run.steps.size() >= 5);
  for (const auto& j : run.steps) {
    const auto& b = j["breakdown"];
    double named = 0;
    for (const char* p : kParts) {
      REQUIRE(b.contains(p));
      CHECK(b[p].get<double>() >= 0);
      if (std::string(p) != "other_ms") named += b[p].get<double>();
    }
    const double measured = j["step_ms"].get<double>() + b["checkpoint_ms"].get<double>() + b["rollback_ms"].get<double>();
    INFO("step " << j["step"] << ": " << b.dump() << " measured " << measured);
    CHECK(j["interval_ms"].get<double>() == doctest::Approx(measured).epsilon(1e-6));
    if (j["step"].get<int64_t>() > 1) CHECK(std::abs(measured - named) <= 0.05 * measured);
  }
  // The end-of-run table per rank, in the summary too.
  REQUIRE(run.summary.contains("breakdown_per_rank"));
  for (const auto& row : run.summary["breakdown_per_rank"]) {
    double named = 0, all = 0;
    for (const char* p : kParts) {
      all += row[p].get<double>();
      if (std::string(p) != "other_ms") named += row[p].get<double>();
    }
    INFO(row.dump());
    CHECK(all > 0);
    CHECK(std::abs(all - named) <= 0.05 * all);
  }
  CHECK(run.r.out.find("step-time breakdown") == std::string::npos);  // --quiet: only in the log
}

std::string gib(double bytes) {
  std::ostringstream o;
  o << std::setprecision(12) << bytes / (1ull << 30);
  return o.str();
}

}  // namespace

TEST_CASE("the quickstart: the breakdown adds up, monitor records every monitor interval, no alert") {
  Run run = train("quickstart", 0, std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml",
                  "--set train.steps=60 --set train.log_every=20 --set train.monitor_every=20 --set train.eval_every=0 "
                  "--set train.threads=2");
  check_breakdown(run);
  CHECK(run.summary["breakdown_per_rank"].size() == 1);
  REQUIRE(run.monitors.size() == 3);  // steps 20, 40, 60 (step 1 has no interval yet)
  for (const auto& m : run.monitors) {
    const auto& t = m["step_ms"];
    CHECK(t["p50"].get<double>() > 0);
    CHECK(t["p50"].get<double>() <= t["p90"].get<double>());
    CHECK(t["p90"].get<double>() <= t["p99"].get<double>());
    CHECK(t["p99"].get<double>() <= t["max"].get<double>());
    CHECK(m["tokens_per_s"].get<double>() > 0);
    CHECK(m["mfu"].get<double>() > 0);
    CHECK(m["peak_memory"]["parameters"].get<double>() > 0);
    CHECK(m["peak_memory"]["activations"].get<double>() > 0);
    CHECK(m["utilization"].get<double>() > 0.7);
  }
  INFO(run.alerts.size() << " alert(s): " << (run.alerts.empty() ? "" : run.alerts[0].dump()));
  CHECK(run.alerts.empty());
  CHECK(run.summary["alerts"].empty());
  const std::string log = [&] {
    std::ifstream in(kDir / "quickstart" / "log.rank0.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  CHECK(log.find("step-time breakdown") != std::string::npos);
  CHECK(log.find("monitor step 20 | step ms p50") != std::string::npos);
  CHECK(log.find("monitor step 60 | step ms p50") != std::string::npos);
}

namespace {

// Lines of `text` that contain `what`.
int count_lines(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("the monitor line at its own interval, not after every step line when log_every is small") {
  // log_every 1: a step line per step, and (the default interval: log_every's multiple of at
  // least 100 steps) the monitor only at the last step, not 30 times.
  Run run = train("monitor_default", 0, layout_recipe(),
                  "--set train.steps=30 --set train.log_every=1 --set train.eval_every=0");
  const std::string log = slurp(kDir / "monitor_default" / "log.rank0.txt");
  CHECK(count_lines(log, " | loss ") == 30);
  CHECK(count_lines(log, "monitor step") == 1);
  CHECK(count_lines(log, "monitor step 30 |") == 1);
  REQUIRE(run.monitors.size() == 1);
  CHECK(run.monitors[0]["step"] == 30);
  // Its own interval: train.monitor_every 10 gives records and lines at 10, 20 and 30, each
  // printed by the step line after it (its gather is complete by then), not an interval late.
  run = train("monitor_10", 0, layout_recipe(),
              "--set train.steps=30 --set train.log_every=1 --set train.monitor_every=10 --set train.eval_every=0");
  REQUIRE(run.monitors.size() == 3);
  for (int k = 0; k < 3; ++k) CHECK(run.monitors[static_cast<size_t>(k)]["step"] == 10 * (k + 1));
  const std::string log10 = slurp(kDir / "monitor_10" / "log.rank0.txt");
  CHECK(count_lines(log10, "monitor step") == 3);
  const size_t m10 = log10.find("monitor step 10 |"), s11 = log10.find("step 11/30 |"), s12 = log10.find("step 12/30 |");
  REQUIRE(m10 != std::string::npos);
  CHECK(m10 > s11);
  CHECK(m10 < s12);
}

TEST_CASE("no straggler alert on one rank: its own slow steps have no peer to be slower than") {
  // The stall that makes rank 1 of two a straggler (below), on a one-rank run: P99 well over
  // 1.5x P50, but no other rank and no other node to move to.
  Run run = train("straggler_one", 0, layout_recipe(),
                  "--set train.steps=110 --set train.log_every=110 --set train.eval_every=0 --set checkpoint.every_steps=1000",
                  "RUNNER_DEBUG_STALL_RANK=0 RUNNER_DEBUG_STALL_EVERY=10 RUNNER_DEBUG_STALL_MS=300");
  REQUIRE(!run.monitors.empty());
  const auto& t = run.monitors.back()["step_ms"];
  CHECK(t["p99"].get<double>() > 1.5 * t["p50"].get<double>());  // the tail a straggler alert would have seen
  CHECK(run.count("straggler") == 0);
  CHECK(run.r.out.find("straggler") == std::string::npos);
}

TEST_CASE("the breakdown adds up on dp2, tp2 and pp2, per rank, and names the slowest rank") {
  for (const char* layout : {"--set parallel.dp=2", "--set parallel.tp=2", "--set parallel.pp=2"}) {
    CAPTURE(layout);
    Run run = train("layout", 2, layout_recipe(), layout);
    check_breakdown(run);
    REQUIRE(run.summary["breakdown_per_rank"].size() == 2);
    REQUIRE(!run.monitors.empty());
    CHECK(run.monitors.back()["per_rank"].size() == 2);
    CHECK(run.monitors.back()["slowest_rank"].get<int>() >= 0);
    const std::string log = [&] {
      std::ifstream in(kDir / "layout" / "log.rank0.txt");
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    CHECK(log.find("slowest: rank") != std::string::npos);
    if (std::string(layout).find("tp") != std::string::npos)  // the tensor-parallel collectives count as communication
      for (const auto& j : run.steps) CHECK(j["breakdown"]["comm_exposed_ms"].get<double>() > 0);
    if (std::string(layout).find("pp") != std::string::npos)
      CHECK(run.summary["breakdown_per_rank"][0]["pipeline_idle_ms"].get<double>() > 0);
  }
}

TEST_CASE("alert: a slow data source") {
  Run run = train("slowdata", 0, layout_recipe(), "--set train.steps=12", "RUNNER_DEBUG_DATA_DELAY_MS=40");
  REQUIRE(run.count("data_wait") == 1);
  for (const auto& a : run.alerts)
    if (a["alert"] == "data_wait") {
      CHECK(a["value"].get<double>() > 0.05);
      CHECK(a["action"].get<std::string>().find("data.workers") != std::string::npos);
      CHECK(a["action"].get<std::string>().find("data.prefetch") != std::string::npos);
    }
  CHECK(run.r.out.find("ALERT data_wait") == std::string::npos);  // --quiet
  check_breakdown(run);
}

TEST_CASE("alert: a stalled rank is a straggler, and the others wait in communication") {
  // 110 steps: the alert wants 100 timed steps (below, the P99 is the maximum); every 10th
  // step rank 1 stalls for 300 ms.
  Run run = train("straggler", 2, layout_recipe(),
                  "--set parallel.dp=2 --set train.steps=110 --set train.log_every=110 --set train.eval_every=0 "
                  "--set checkpoint.every_steps=1000",
                  "RUNNER_DEBUG_STALL_RANK=1 RUNNER_DEBUG_STALL_EVERY=10 RUNNER_DEBUG_STALL_MS=300");
  REQUIRE(run.count("straggler") == 1);
  REQUIRE(run.count("communication") == 1);
  for (const auto& a : run.alerts) {
    INFO(a.dump());
    if (a["alert"] == "straggler") CHECK(a["message"].get<std::string>().find("straggler is rank 1 ") != std::string::npos);
    if (a["alert"] == "communication") CHECK(a["message"].get<std::string>().find("rank 0 ") != std::string::npos);
  }
  CHECK(run.monitors.back()["slowest_rank"].get<int>() == 1);
}

TEST_CASE("alert: pipeline stage imbalance") {
  Run run = train("imbalance", 2, layout_recipe(), "--set parallel.pp=2 --set train.steps=8 --set train.log_every=4",
                  "RUNNER_DEBUG_STALL_RANK=1 RUNNER_DEBUG_STALL_EVERY=1 RUNNER_DEBUG_STALL_MS=150");
  REQUIRE(run.count("stage_imbalance") == 1);
  CHECK(run.monitors.back()["slowest_stage"].get<int>() == 1);
  CHECK(run.count("utilization") == 1);  // stage 0 idles while stage 1 stalls
}

TEST_CASE("alert: loss spike and gradient-norm spike on a corrupt batch") {
  // A smaller quickstart that has learnt something by step 75, when one batch is random tokens.
  Run run = train("spike", 0, std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml",
                  "--set train.steps=80 --set train.log_every=40 --set train.eval_every=0 --set model.d_model=64 "
                  "--set batch.micro=8",
                  "RUNNER_FAULT_NOISE_STEP=75");
  INFO(run.alerts.size());
  REQUIRE(run.count("loss_spike") == 1);
  REQUIRE(run.count("grad_norm_spike") == 1);
  for (const auto& a : run.alerts)
    if (a["alert"] == "loss_spike" || a["alert"] == "grad_norm_spike") CHECK(a["step"].get<int>() == 75);
}

TEST_CASE("alert: memory within 5% of a tight device limit") {
  // First the measured peak, then a device just 3% larger than it (the plan still fits).
  Run probe = train("memprobe", 0, layout_recipe(), "--set train.steps=3 --set train.log_every=3");
  REQUIRE(!probe.monitors.empty());
  const double peak = probe.monitors.back()["peak_bytes"].get<double>();
  double predicted = 0;
  {
    std::ifstream in(kDir / "memprobe" / "plan.json");
    auto plan = nlohmann::json::parse(in);
    INFO(plan.dump().substr(0, 2000));
    REQUIRE(plan.contains("stages"));
    for (const auto& s : plan["stages"]) predicted = std::max(predicted, s["total_bytes"].get<double>());
  }
  CAPTURE(peak);
  CAPTURE(predicted);
  const double limit = std::max(peak, predicted) * 1.01;
  REQUIRE(peak >= 0.95 * limit);  // else the ledger and the measurement are too far apart for this test
  Run run = train("memtight", 0, layout_recipe(),
                  "--set train.steps=3 --set train.log_every=3 --set hardware.memory_gb=" + gib(limit));
  REQUIRE(run.count("memory") == 1);
  CHECK(probe.count("memory") == 0);
}

TEST_CASE("--profile FROM:TO: per operator forward/backward/recompute, FLOPs from the graph, evaluation excluded") {
  const std::string recipe = layout_recipe();
  // Evaluation after step 4 runs forward passes inside the window; they must not count.
  Run run = train("profile", 0, recipe, "--set train.steps=6 --set train.eval_every=4 --profile 3:5");
  const fs::path dir = kDir / "profile";
  REQUIRE(fs::exists(dir / "profile.json"));
  REQUIRE(fs::exists(dir / "profile.rank0.json"));
  nlohmann::json p = nlohmann::json::parse(std::ifstream(dir / "profile.json"));
  CHECK(p["steps"] == 3);
  runner::Plan plan = runner::make_plan(runner::load_recipe(recipe), 1);
  ops::Graph g = runner::build_gpt_graph(plan.layout->spec(0, 0));
  const double passes = static_cast<double>(plan.accum) * 3;
  std::map<std::string, double> nodes, flops;
  double graph_flops = 0;
  for (const ops::Node& n : g.nodes) {
    nodes[ops::op_name(n.kind)] += 1;
    flops[ops::op_name(n.kind)] += runner::plan_detail::node_flops(g, n);
    graph_flops += runner::plan_detail::node_flops(g, n) * passes;
  }
  // The roofline: the measured peak and bandwidth, each operator placed against it.
  const auto& roof = p["roofline"];
  const double peak = roof["peak_gflops_per_s"].get<double>(), bw = roof["bandwidth_gb_per_s"].get<double>();
  CHECK(peak > 0);
  CHECK(bw > 0);
  CHECK(roof["ridge_flops_per_byte"].get<double>() == doctest::Approx(peak / bw));
  double profile_fwd_flops = 0, share = 0, prev_ms = 1e300, matmul_flops = 0;
  REQUIRE(p["ops"].size() == nodes.size());
  for (const auto& op : p["ops"]) {
    const std::string name = op["op"];
    CAPTURE(name);
    CHECK(op["forward"]["calls"].get<double>() == nodes[name] * passes);
    CHECK(op["forward"]["flops"].get<double>() == doctest::Approx(flops[name] * passes));
    CHECK(op["forward"]["ms"].get<double>() > 0);
    CHECK(op["backward"]["ms"].get<double>() > 0);
    CHECK(op["recompute"]["calls"] == 0);  // recompute is off in this recipe
    CHECK(op["ms"].get<double>() <= prev_ms);  // sorted by time
    prev_ms = op["ms"].get<double>();
    CHECK(op["gflops_per_s"].get<double>() > 0);
    CHECK(op["gb_per_s"].get<double>() > 0);
    const double intensity = op["intensity"].get<double>();
    CHECK(intensity == doctest::Approx(op["flops"].get<double>() / op["bytes"].get<double>()));
    CHECK(op["bound"] == (intensity >= peak / bw ? "compute" : "memory"));
    CHECK(op["roof_gflops_per_s"].get<double>() == doctest::Approx(std::min(peak, intensity * bw)));
    CHECK(op["of_roof"].get<double>() == doctest::Approx(op["gflops_per_s"].get<double>() / op["roof_gflops_per_s"].get<double>()));
    if (name == "add") CHECK(op["bound"] == "memory");
    profile_fwd_flops += op["forward"]["flops"].get<double>();
    share += op["share"].get<double>();
    // linear_gelu: the MLP's fc product fused with its GELU, whose few flops per
    // element ride along.
    if (name == "linear" || name == "linear_gelu" || name == "attention") matmul_flops += op["flops"].get<double>();
  }
  CHECK(profile_fwd_flops == doctest::Approx(graph_flops));
  CHECK(share > 0.1);  // a tiny model: much of its step is outside the kernels
  CHECK(share <= 1.0);
  // The matrix products' forward and backward against the plan's 6N + attention per token
  // (6N also counts the position embedding, which no product uses).
  const double per_token = matmul_flops / (3.0 * static_cast<double>(plan.tokens_per_step));
  CAPTURE(per_token);
  CAPTURE(plan.flops_per_token);
  CHECK(per_token == doctest::Approx(plan.flops_per_token).epsilon(0.15));
  const std::string log = [&] {
    std::ifstream in(dir / "log.rank0.txt");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  CHECK(log.find("profile of steps 3..5") != std::string::npos);

  // A window outside the run is refused before anything is written.
  Result bad = sh(std::string(RUNNER_BINARY) + " train " + recipe + " --run-dir " + (kDir / "badprofile").string() +
                  " --set train.steps=6 --profile 5:9");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("--profile '5:9'") != std::string::npos);
  CHECK(bad.out.find("FROM:TO") != std::string::npos);
  CHECK_FALSE(fs::exists(kDir / "badprofile"));
  // The recipe's profile section, pointed at by file:line:col when wrong.
  const fs::path rp = kDir / "profiled.yaml";
  std::ofstream(rp) << kLayoutRecipe << "profile:\n  steps: \"2:x\"\n";
  Result bad2 = sh(std::string(RUNNER_BINARY) + " train " + rp.string() + " --run-dir " + (kDir / "badprofile").string());
  CHECK(bad2.code == 2);
  CHECK(bad2.out.find(rp.string() + ":") != std::string::npos);
  CHECK(bad2.out.find("profile.steps '2:x'") != std::string::npos);
  CHECK_FALSE(fs::exists(kDir / "badprofile"));
  std::ofstream(kDir / "profiled_ok.yaml") << kLayoutRecipe << "profile:\n  steps: \"2\"\n";
  train("profiled", 0, (kDir / "profiled_ok.yaml").string(), "--set train.steps=3");
  nlohmann::json p2 = nlohmann::json::parse(std::ifstream(kDir / "profiled" / "profile.json"));
  CHECK(p2["from_step"] == 2);
  CHECK(p2["to_step"] == 2);
}
