// runner report RUN_DIR, through the real binary: a profiled run's report.html has every plot
// as inline SVG and no external reference; a run still in progress (no summary, a cut last
// line) and a two-rank run are reported; a bad run directory exits 2; and headless Chromium
// renders the page (a screenshot that is not blank, no console error). Chromium missing is a
// failure: scripts/setup.sh installs it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using test_support::Result;
using test_support::sh;

namespace {

const test_support::TempDir kScratch("test_report");
const fs::path& kDir = kScratch.path;
using test_support::slurp;

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// The quickstart, 12 steps, operators profiled on steps 4 to 8, a monitor record every 4 steps
// (made once).
const fs::path& profiled_run() {
  static fs::path dir = [] {
    fs::path d = kDir / "profiled";
    std::string cmd = std::string("OMP_NUM_THREADS=1 timeout 300 ") + RUNNER_BINARY + " train " + RUNNER_TEST_DIR +
                      "/../recipes/quickstart.yaml --quiet --run-dir " + d.string() +
                      " --set train.steps=12 --set train.log_every=4 --set train.monitor_every=4 --set train.eval_every=6 "
                      "--profile 4:8";
    Result r = sh(cmd);
    INFO(cmd << "\n" << r.out);
    REQUIRE(r.code == 0);
    return d;
  }();
  return dir;
}

Result report(const fs::path& dir) { return sh(std::string(RUNNER_BINARY) + " report " + dir.string()); }

void no_external_references(const std::string& h) {
  CHECK(h.find("http") == std::string::npos);
  CHECK(h.find("<script") == std::string::npos);
  CHECK(h.find("src=") == std::string::npos);
  CHECK(h.find("<link") == std::string::npos);
  CHECK(h.find("url(") == std::string::npos);
  CHECK(h.find("@import") == std::string::npos);
}

}  // namespace

TEST_CASE("report: a profiled run has every plot as inline SVG and nothing external") {
  const fs::path& dir = profiled_run();
  Result r = report(dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("12 steps") != std::string::npos);
  const std::string h = slurp(dir / "report.html");
  no_external_references(h);
  for (const char* title : {"Loss", "Learning rate", "Gradient norm", "Loss scale", "Tokens/s", "Step time", "MFU and utilization",
                            "Step-time distribution", "Step-time breakdown", "Memory per account", "Roofline"})
    CHECK_MESSAGE(h.find(std::string("class=\"t\">") + title) != std::string::npos, title);
  CHECK(count(h, "<svg") == 11);
  CHECK(count(h, "<svg") == count(h, "</svg>"));
  CHECK(h.find("class=\"P50\"") != std::string::npos);
  CHECK(h.find("class=\"P99\"") != std::string::npos);
  CHECK(h.find("class=\"roof\"") != std::string::npos);
  CHECK(h.find("finished") != std::string::npos);
  // The eval curve is drawn beside the training loss; every profiled operator is in the
  // table and on the roofline.
  CHECK(h.find(">eval</text>") != std::string::npos);
  auto prof = nlohmann::json::parse(slurp(dir / "profile.json"));
  REQUIRE(prof["ops"].size() > 0);
  for (auto& o : prof["ops"]) {
    std::string op = o["op"];
    CHECK_MESSAGE(h.find("<tr><td>" + op + "</td>") != std::string::npos, op);
    CHECK_MESSAGE(h.find("<title>" + op + ":") != std::string::npos, op);
  }
  // The breakdown has one bar per step (12 steps: fewer than the 100-bar cap).
  CHECK(count(h, "<g><title>steps ") == 12);
  // The recipe and the plan are there, escaped.
  CHECK(h.find("kind: addition") != std::string::npos);
  CHECK(h.find("&quot;tokens_per_step&quot;") != std::string::npos);
}

TEST_CASE("report: a run in progress (no summary, a cut last line)") {
  const fs::path& src = profiled_run();
  const fs::path dir = kDir / "partial";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"plan.json", "recipe.yaml"}) fs::copy_file(src / f, dir / f);
  std::ifstream in(src / "metrics.jsonl");
  std::ofstream out(dir / "metrics.jsonl");
  int steps = 0;
  std::string cut;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("summary")) continue;
    if (j.contains("step_ms") && !j.contains("monitor") && j["step"].get<int>() > 9) {
      cut = line.substr(0, line.size() / 2);  // a record being written
      break;
    }
    steps += j.contains("step_ms") && !j.contains("monitor");
    out << line << "\n";
  }
  out << cut;
  out.close();
  REQUIRE(steps == 9);
  Result r = report(dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("9 steps, run in progress") != std::string::npos);
  const std::string h = slurp(dir / "report.html");
  CHECK(h.find("in progress (no summary record yet)") != std::string::npos);
  CHECK(h.find("1 unreadable line(s) skipped") != std::string::npos);
  CHECK(count(h, "<g><title>steps ") == 9);
  CHECK(count(h, "<svg") == 10);  // no profile.json: no roofline
  CHECK(h.find("no operator profile") != std::string::npos);
  no_external_references(h);
}

TEST_CASE("report: a two-rank run has a breakdown row per rank") {
  const fs::path dir = kDir / "tp2";
  const fs::path recipe = test_support::write_layout_recipe(kDir);
  std::string cmd = test_support::mpirun(2) + RUNNER_BINARY + " train " + recipe.string() + " --quiet --run-dir " + dir.string() +
                    " --set parallel.tp=2 --set train.steps=6 --profile 2:4";
  Result t = sh(cmd);
  INFO(cmd << "\n" << t.out);
  REQUIRE(t.code == 0);
  Result r = report(dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string h = slurp(dir / "report.html");
  CHECK(h.find("&quot;tp&quot;:2") != std::string::npos);
  CHECK(h.find("profile.rank0.json, profile.rank1.json") != std::string::npos);
  CHECK(h.find("<tr><td>0</td><td>0</td>") != std::string::npos);
  CHECK(h.find("<tr><td>1</td><td>0</td>") != std::string::npos);
  no_external_references(h);
  // The merged trace has a track (pid) per rank, each with its operators.
  auto merged = nlohmann::json::parse(slurp(dir / "trace.json"));
  std::map<int, int> per_pid;
  for (auto& e : merged["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 1) per_pid[e["pid"].get<int>()]++;
  CHECK(per_pid.size() == 2);
  CHECK(per_pid[0] > 0);
  CHECK(per_pid[0] == per_pid[1]);  // tensor parallel: both ranks run the same nodes
  CHECK(fs::exists(dir / "trace.rank1.json"));
}

// --profile writes Chrome trace-event files: every operator node of every profiled step, forward
// and backward, inside its step's span; the event counts agree with the executor's per-kind
// call counters in profile.json (a different path through the code).
TEST_CASE("trace: an event per operator node of each profiled step") {
  const fs::path& dir = profiled_run();
  auto t = nlohmann::json::parse(slurp(dir / "trace.rank0.json"));
  auto merged = nlohmann::json::parse(slurp(dir / "trace.json"));
  CHECK(merged["traceEvents"].size() == t["traceEvents"].size());
  auto prof = nlohmann::json::parse(slurp(dir / "profile.json"));
  std::map<int64_t, std::pair<double, double>> span;
  std::map<std::pair<int64_t, std::string>, std::set<int>> nodes;
  std::map<std::string, int64_t> calls;  // per op kind, forward
  for (auto& e : t["traceEvents"]) {
    if (e["ph"] != "X") continue;
    CHECK(e["pid"] == 0);
    if (e["cat"] == "step") {
      span[e["args"]["step"].get<int64_t>()] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
      continue;
    }
    const std::string cat = e["cat"];
    if (cat != "forward" && cat != "backward" && cat != "recompute") continue;  // loop phases (tests/test_trace.cpp)
    int64_t step = e["args"]["step"];
    CHECK(nodes[{step, e["cat"].get<std::string>()}].insert(e["args"]["node"].get<int>()).second);  // once per step and pass
    if (e["cat"] == "forward") calls[e["args"]["op"].get<std::string>()]++;
    REQUIRE(span.count(step));
    CHECK(e["ts"].get<double>() >= span[step].first);
    CHECK(e["ts"].get<double>() + e["dur"].get<double>() <= span[step].second + 1e-3);
  }
  CHECK(span.size() == 5);
  for (int64_t step = 4; step <= 8; ++step) {
    REQUIRE(span.count(step));
    const auto& f = nodes[{step, "forward"}];
    REQUIRE(!f.empty());
    CHECK(*f.rbegin() + 1 == static_cast<int>(f.size()));  // nodes 0..N-1, none missing
    CHECK(nodes[{step, "backward"}] == f);
  }
  for (auto& o : prof["ops"]) CHECK_MESSAGE(calls[o["op"].get<std::string>()] == o["forward"]["calls"].get<int64_t>(), o["op"]);
}

TEST_CASE("report: a bad run directory exits 2 and says why") {
  Result r = report(kDir / "no_such_run");
  CHECK(r.code == 2);
  CHECK(r.out.find("no_such_run: not a directory") != std::string::npos);
  fs::create_directories(kDir / "empty");
  r = report(kDir / "empty");
  CHECK(r.code == 2);
  CHECK(r.out.find("no metrics.jsonl") != std::string::npos);
  std::ofstream(kDir / "empty" / "metrics.jsonl") << "{\"step\": 1, \"step_m";
  r = report(kDir / "empty");
  CHECK(r.code == 2);
  CHECK(r.out.find("no step record yet") != std::string::npos);
}

TEST_CASE("report: headless Chromium renders it, not blank, no console error") {
  const fs::path& dir = profiled_run();
  if (!fs::exists(dir / "report.html")) REQUIRE(report(dir).code == 0);
  const char* chromium = "/usr/bin/chromium";
  INFO("Chromium is needed for this test: bash scripts/setup.sh (or apt-get install -y --no-install-recommends chromium)");
  REQUIRE_MESSAGE(::access(chromium, X_OK) == 0, "missing /usr/bin/chromium");
  const fs::path png = kDir / "report.png", profile = kDir / "chromium_profile";
  fs::remove_all(profile);
  std::string cmd = std::string("timeout 120 ") + chromium +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
                    " --disable-component-update --disable-sync --user-data-dir=" + profile.string() +
                    " --window-size=1200,2400 --enable-logging=stderr --v=0 --screenshot=" + png.string() + " file://" +
                    fs::absolute(dir / "report.html").string();
  Result r = sh(cmd);
  INFO(cmd << "\n" << r.out);
  REQUIRE(r.code == 0);
  REQUIRE(fs::exists(png));
  CHECK(r.out.find("Uncaught") == std::string::npos);
  CHECK(r.out.find("CONSOLE(") == std::string::npos);
  CHECK(r.out.find("ERR_FILE_NOT_FOUND") == std::string::npos);
  Result s = sh(std::string("python3 ") + RUNNER_TEST_DIR + "/png_stats.py " + png.string());
  INFO(s.out);
  REQUIRE(s.code == 0);
  auto st = nlohmann::json::parse(s.out);
  CHECK(st["width"] == 1200);
  CHECK(st["height"] == 2400);
  // A blank page is one colour; the plots bring hundreds (anti-aliased lines, ten series
  // colours, text) and cover a good part of the page.
  CHECK(st["colours"].get<int>() > 200);
  CHECK(st["non_background"].get<double>() > 0.15);
}
