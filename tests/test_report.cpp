// runner report RUN_DIR, through the real binary: a profiled run's report.html has every plot
// as inline SVG and no external reference; a run still in progress (no summary, a cut last
// line) and a two-rank run are reported; a bad run directory exits 2; and headless Chromium
// renders the page (a screenshot that is not blank, no console error). Chromium missing is a
// failure: scripts/setup.sh installs it.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runner/report/format.h"
#include "runner/report/recipe_view.h"
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

// A fresh kDir/NAME with `files` copied from the profiled run (the rest a test writes itself).
fs::path copy_of_profiled_run(const std::string& name, std::initializer_list<const char*> files) {
  const fs::path& src = profiled_run();
  const fs::path dir = kDir / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : files) fs::copy_file(src / f, dir / f);
  return dir;
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
  for (const char* title : {"Loss", "Held-out accuracy", "Learning rate", "Gradient norm", "Tokens/s", "Step time", "MFU and utilization",
                            "Step-time distribution", "Step-time breakdown", "Memory per account", "Roofline"})
    CHECK_MESSAGE(h.find(std::string("class=\"t\">") + title) != std::string::npos, title);
  // fp32: no loss scaling, so no loss-scale chart (the records' constant 1 says nothing).
  CHECK(h.find("class=\"t\">Loss scale") == std::string::npos);
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
  // The summary table: figures in their units, the layout in words, no JSON.
  const size_t kv = h.find("<table class=\"kv\">");
  REQUIRE(kv != std::string::npos);
  const std::string table = h.substr(kv, h.find("</table>", kv) - kv);
  INFO(table);
  for (const char* raw : {"{", "[", "&quot;", "_ms", "_s<", "e+"}) CHECK_MESSAGE(table.find(raw) == std::string::npos, raw);
  CHECK(table.find("<th>layout</th><td>dp 1 x tp 1 x pp 1 (1 rank)</td>") != std::string::npos);
  CHECK(table.find("<th>step time</th><td>p50 ") != std::string::npos);
  CHECK(table.find("<th>MFU</th><td>") != std::string::npos);
  CHECK(h.find("layout dp 1 x tp 1 x pp 1 (1 rank)</p>") != std::string::npos);
  // The recipe (addition data: its digits, no data file fields) and the plan are there, escaped.
  CHECK(h.find("kind: addition") != std::string::npos);
  CHECK(h.find("  digits: 3") != std::string::npos);
  CHECK(h.find("  dataset: tokens") == std::string::npos);
  CHECK(h.find("  val_fraction:") == std::string::npos);
  CHECK(h.find("growth_interval") == std::string::npos);
  CHECK(h.find("&quot;tokens_per_step&quot;") != std::string::npos);  // plan.json itself, folded
  CHECK(h.find("<th>batch</th><td>global 32 = micro 32 x dp 1 x accum 1, 2,048 tokens per step</td>") != std::string::npos);
  CHECK(h.find("<th>fits</th><td>yes: largest stage ") != std::string::npos);
  // The addition task's accuracy is drawn on a 0-100% axis; MFU and utilization in percent.
  CHECK(h.find("class=\"ay\">100</text>") != std::string::npos);
  CHECK(h.find("% right") != std::string::npos);
  // On the same step axis as the training curves (1 to 12), though evaluated at 6 and 12 only.
  const size_t acc = h.find("class=\"t\">Held-out accuracy");
  REQUIRE(acc != std::string::npos);
  const std::string acc_svg = h.substr(acc, h.find("</svg>", acc) - acc);
  CHECK(acc_svg.find("class=\"ax\">2</text>") != std::string::npos);
}

TEST_CASE("report: a run in progress (no summary, a cut last line)") {
  const fs::path& src = profiled_run();
  const fs::path dir = copy_of_profiled_run("partial", {"plan.json", "recipe.yaml"});
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
  CHECK(count(h, "<svg") == 10);  // no profile.json: no roofline; fp32: no loss scale
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
  CHECK(h.find("layout dp 1 x tp 2 x pp 1 (2 ranks)") != std::string::npos);
  CHECK(h.find("<th>layout</th><td>dp 1 x tp 2 x pp 1 (2 ranks)</td>") != std::string::npos);
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

// ---- the figures and ticks (runner/report/format.h) ----

namespace {

// The step's mantissa: 1, 2 or 5 (x 10^k).
double mantissa(double step) {
  const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  return std::round(m * 1e6) / 1e6;
}

// A tick label says its tick exactly, with no more decimals than the step has: "0.0004" on a
// step of 0.0001, "40k", "1e-5"; never "0.000472" or "15.8" (that is what an odd tick reads as).
void check_label(double v, double step, const std::string& label) {
  INFO(v << " (step " << step << ") -> " << label);
  char* end = nullptr;
  double back = std::strtod(label.c_str(), &end);
  const std::string suffix(end);
  const double scale = suffix == "k" ? 1e3 : suffix == "M" ? 1e6 : suffix == "G" ? 1e9 : suffix == "T" ? 1e12 : 1;
  CHECK((suffix.empty() || scale != 1));
  CHECK(back * scale == doctest::Approx(v).epsilon(1e-12).scale(step));
  const size_t dot = label.find('.'), e = label.find('e');
  const int decimals = dot == std::string::npos ? 0 : static_cast<int>((e == std::string::npos ? label.size() : e) - dot - 1);
  CHECK(decimals <= std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9))));
}

}  // namespace

TEST_CASE("report ticks: 1-2-5 steps on awkward ranges, labels without stray digits") {
  using runner::report::linear_ticks;
  using runner::report::tick_label;
  const std::pair<double, double> ranges[] = {{0, 75.8},      {0, 0.000472},  {2.96, 5.7},   {1, 61},       {6.28, 51},
                                              {0, 85566},     {-3.2, 7.9},    {1e-9, 3.3e-9}, {1234.5, 1234.9}, {0.7, 0.7},
                                              {21392, 85566}, {0, 1.49e11},   {1, 3},        {0.000788, 0.001}};
  for (auto [lo, hi] : ranges)
    for (bool loose : {true, false}) {
      auto t = linear_ticks(lo, hi, 5, loose);
      INFO(lo << " .. " << hi << (loose ? " loose" : " tight"));
      const double m = mantissa(t.step);
      CHECK((m == 1 || m == 2 || m == 5));
      REQUIRE(t.at.size() >= 2);
      CHECK(t.at.size() <= 6);
      for (double v : t.at) {
        const double k = v / t.step;
        CHECK(std::fabs(k - std::round(k)) < 1e-6);  // every tick a multiple of the step
        const std::string label = tick_label(v, t.step);
        check_label(v, t.step, label);
        CHECK(label.find("e+") == std::string::npos);
      }
      if (loose && hi > lo) {  // the axis holds the data, ending on ticks
        CHECK(t.lo <= lo);
        CHECK(t.hi >= hi);
        CHECK(t.lo == t.at.front());
        CHECK(t.hi == t.at.back());
      } else if (hi > lo) {  // a step axis keeps its ends, the ticks inside
        CHECK(t.at.front() >= lo - 1e-12);
        CHECK(t.at.back() <= hi + 1e-12);
      }
    }
  // The two ranges of the issue, exactly.
  auto a = linear_ticks(0, 75.8, 5, true);
  CHECK(a.step == 20);
  CHECK(a.at == std::vector<double>{0, 20, 40, 60, 80});
  auto b = linear_ticks(0, 0.000472, 5, true);
  CHECK(b.step == doctest::Approx(0.0001));
  std::vector<std::string> bl;
  for (double v : b.at) bl.push_back(tick_label(v, b.step));
  CHECK(bl == std::vector<std::string>{"0", "0.0001", "0.0002", "0.0003", "0.0004", "0.0005"});
  // One prefix per axis, from its step; steps and counts are whole.
  auto c = linear_ticks(0, 85566, 5, true);
  std::vector<std::string> cl;
  for (double v : c.at) cl.push_back(tick_label(v, c.step));
  CHECK(cl == std::vector<std::string>{"0", "20k", "40k", "60k", "80k", "100k"});
  auto d = linear_ticks(1, 3, 6, false, /*integer=*/true);
  CHECK(d.at == std::vector<double>{1, 2, 3});
  CHECK(tick_label(2e-5, 1e-5) == "2e-5");
  // Log axes: a tick per decade.
  auto l = runner::report::log_ticks(0.03, 2000);
  CHECK(l.at == std::vector<double>{0.01, 0.1, 1, 10, 100, 1000, 10000});
  CHECK(tick_label(10000, 0) == "10k");
  CHECK(tick_label(0.01, 0) == "0.01");
}

TEST_CASE("report summary: every field in its unit, no JSON") {
  // A finished two-rank run's summary record, as runner/observe/metrics.cpp writes it.
  auto summary = nlohmann::json::parse(R"({"summary":true,"steps":1500,"tokens":30720000,"tokens_per_s":63088.03,
    "wall_s":486.9,"val_loss":1.234567,"accuracy":0.9312,"peak_flops":148753790341.2,"skipped_steps":2,
    "loss_scale":{"final":32768.0,"skipped_steps":2},"layout":{"dp":2,"pp":1,"schedule":"1f1b","tp":1,"world":2,"zero":1},
    "comm_hidden_ms":120.5,"comm_exposed_ms":30.1,"comm_hidden_fraction":0.8,"pipeline_idle_fraction":[0.0],
    "plan_bubble":0.0,"breakdown_per_rank":[{"rank":0}],"step_ms":{"max":50.957,"p50":6.4989,"p90":10.73,"p99":50.957},
    "checkpoint_ms":14.717,"alerts":["spike"],"ledger":{"parameters":{"measured":1,"predicted":1}},"top_ops":[],
    "peak_source":"measured"})");
  auto plan = nlohmann::json::parse(R"({"flops_per_token":821760.0})");
  auto rows = runner::report::summary_rows(summary, plan);
  std::map<std::string, std::string> m(rows.begin(), rows.end());
  for (auto& [k, v] : rows) {
    INFO(k << ": " << v);
    CHECK(v.find('{') == std::string::npos);
    CHECK(v.find('[') == std::string::npos);
    CHECK(v.find('"') == std::string::npos);
    CHECK(k.find('_') == std::string::npos);  // labels, not record keys
  }
  CHECK(m["layout"] == "dp 2 x tp 1 x pp 1 (2 ranks, ZeRO-1)");
  CHECK(m["steps"] == "1,500");
  CHECK(m["tokens"] == "30,720,000");
  CHECK(m["tokens/s"] == "63.1k");
  CHECK(m["wall time"] == "8 min 07 s");
  CHECK(m["step time"] == "p50 6.50 ms, p90 10.7 ms, p99 51.0 ms, max 51.0 ms");
  CHECK(m["final val loss"] == "1.2346");
  CHECK(m["accuracy"] == "93.1%");
  CHECK(m["MFU"] == "34.9% of 149 GFLOP/s peak");  // 821760 x 63088 / 1.4875e11, as the run's last line
  CHECK(m["fp16 loss scale"] == "32768 at the end, 2 overflowed step(s) skipped");
  CHECK(m["communication hidden"] == "80.0% (120.5 ms hidden behind backward, 30.1 ms exposed)");
  CHECK(m["pipeline idle"] == "no pipeline (pp 1)");
  CHECK(m["checkpoint time"] == "14.7 ms");
  CHECK(m["alerts"] == "spike");
  CHECK(m["peak source"] == "measured");  // a field the table does not know: its key in words, its value as text
  for (const char* gone : {"ledger", "top_ops", "breakdown_per_rank", "summary"}) CHECK(m.count(gone) == 0);
  // Pipeline stages each with their idle share; a monitor record while the run goes on.
  summary["pipeline_idle_fraction"] = {0.125, 0.031};
  rows = runner::report::summary_rows(summary, plan);
  CHECK(std::map<std::string, std::string>(rows.begin(), rows.end())["pipeline idle"] == "stage 0 12.5%, stage 1 3.1%");
  auto mon = nlohmann::json::parse(R"({"monitor":true,"step":40,"tokens_per_s":71234.5,"mfu":0.372,"utilization":0.9961,
    "step_ms":{"max":10.4,"p50":6.78,"p90":10.4,"p99":10.4},"skipped_steps":0,"slowest_rank":0,"peak_bytes":8372224,
    "per_rank":[{"rank":0}]})");
  auto mr = runner::report::monitor_rows(mon);
  std::map<std::string, std::string> mm(mr.begin(), mr.end());
  CHECK(mm["MFU"] == "37.2%");
  CHECK(mm["utilization"] == "99.6%");
  CHECK(mm["step time"] == "p50 6.78 ms, p90 10.4 ms, p99 10.4 ms, max 10.4 ms");
  CHECK(mm["peak memory"] == "8.0 MiB");
  CHECK(mm.count("slowest rank") == 0);  // one rank: no slowest
}

TEST_CASE("report recipe view: the fields of the run's data kind and precision only") {
  const std::string text = slurp(profiled_run() / "recipe.yaml");  // addition, fp32, pp 1
  REQUIRE(text.find("  digits: 3\n") != std::string::npos);
  REQUIRE(text.find("  dataset: tokens\n") != std::string::npos);  // recipe.yaml holds every field
  auto lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::istringstream in(t);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  // What is kept is the file's own lines, in order.
  auto subsequence = [&](const std::string& part) {
    auto all = lines(text), sub = lines(part);
    size_t i = 0;
    for (auto& l : all)
      if (i < sub.size() && l == sub[i]) ++i;
    return i == sub.size();
  };
  auto v = runner::report::recipe_view(text);
  REQUIRE(v.loss_scaling.has_value());
  CHECK(!*v.loss_scaling);
  CHECK(subsequence(v.text));
  CHECK(v.text.find("  digits: 3\n") != std::string::npos);
  for (const char* gone : {"  path:", "  val_path:", "  val_fraction:", "  dataset:", "  loss_scale:", "    growth_interval:",
                           "  virtual_stages:", "  stage_layers:"})
    CHECK_MESSAGE(v.text.find(gone) == std::string::npos, gone);
  for (const char* kept : {"  compute: fp32\n", "  workers: 1\n", "  keep_last: 2\n", "  d_model: 128\n", "  micro: 32\n"})
    CHECK_MESSAGE(v.text.find(kept) != std::string::npos, kept);
  const std::string said = fmt::format("{}", fmt::join(v.left_out, "; "));
  CHECK(said.find("data.dataset (data.kind is addition, not hdf5)") != std::string::npos);
  CHECK(said.find("precision.loss_scale (precision.compute is fp32: no loss scaling)") != std::string::npos);

  // HDF5 data in fp16: the file's fields and the loss scale, no digits.
  std::string h5 = text;
  h5.replace(h5.find("kind: addition"), 14, "kind: hdf5");
  h5.replace(h5.find("path: \"\""), 8, "path: \"/data/tokens.h5\"");
  h5.replace(h5.find("compute: fp32"), 13, "compute: fp16");
  v = runner::report::recipe_view(h5);
  CHECK(*v.loss_scaling);
  CHECK(v.text.find("  digits:") == std::string::npos);
  for (const char* kept : {"  path: \"/data/tokens.h5\"\n", "  val_fraction: 0.05\n", "  dataset: tokens\n", "  loss_scale:\n",
                           "    mode: dynamic\n", "    growth_interval: 2000\n", "  diagnostics: false\n"})
    CHECK_MESSAGE(v.text.find(kept) != std::string::npos, kept);
  CHECK(v.text.find("  val_path:") == std::string::npos);  // empty: the held-out fraction says it
  // fp16 without scaling: no loss-scale chart either.
  std::string none = h5;
  none.replace(none.find("mode: dynamic"), 13, "mode: none");
  CHECK(!*runner::report::recipe_view(none).loss_scaling);
  // Not YAML: shown as it is, and the records decide the chart.
  v = runner::report::recipe_view("name: [unclosed\n");
  CHECK(!v.loss_scaling.has_value());
  CHECK(v.text == "name: [unclosed\n");
}

TEST_CASE("report: an fp16 run on text data has the loss-scale chart and its data fields") {
  const fs::path dir = kDir / "fp16_text";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream t(dir / "text.txt");
    for (int i = 0; i < 600; ++i) t << "the quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  const fs::path run = dir / "run";
  Result r = test_support::runner_cmd(test_support::tiny_quickstart_args(run, 6, 32) + " data.kind=text data.path=" +
                                      (dir / "text.txt").string() + " precision.compute=fp16 train.log_every=1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  r = report(run);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string h = slurp(run / "report.html");
  CHECK(h.find("class=\"t\">Loss scale") != std::string::npos);
  CHECK(h.find("<th>fp16 loss scale</th><td>") != std::string::npos);
  CHECK(h.find("  kind: text") != std::string::npos);
  CHECK(h.find("text.txt") != std::string::npos);
  CHECK(h.find("  digits:") == std::string::npos);
  CHECK(h.find("  dataset:") == std::string::npos);
  CHECK(h.find("data.digits (data.kind is text)") != std::string::npos);
  CHECK(h.find("    growth_interval: 2000") != std::string::npos);
}

// The jobs that made a run: a killed job (a start with no end), the resume after it (also a
// dashed line on the loss curve at the step it went on from), an end, and an event this
// report does not know, shown by its fields.
TEST_CASE("report: the run history from events.jsonl") {
  const fs::path& src = profiled_run();
  const fs::path dir = copy_of_profiled_run("history", {"plan.json", "recipe.yaml", "metrics.jsonl"});
  {
    std::ofstream ev(dir / "events.jsonl");
    ev << R"({"accum":1,"dp":1,"event":"start","global":16,"host":"vm","micro":16,"notes":[],"pp":1,"resumed_from":-1,"time":"2026-12-03T12:14:12Z","tp":1,"world":1})" "\n"
       << R"({"accum":1,"dp":1,"event":"start","global":16,"host":"vm","micro":16,"notes":[],"pp":1,"resumed_from":6,"time":"2026-12-03T12:20:00Z","tp":1,"world":1})" "\n"
       << R"({"event":"recipe_changed","fields":["optimizer.lr"],"time":"2026-12-03T12:20:00Z"})" "\n"
       << R"({"cause":"done","event":"end","exit_code":0,"step":12,"time":"2026-12-03T12:21:00Z"})" "\n";
  }
  Result r = report(dir);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string h = slurp(dir / "report.html");
  CHECK(h.find("<tr><td>2026-12-03 12:14:12 UTC</td><td>started</td><td>dp 1 x tp 1 x pp 1 (1 rank), global batch 16 = micro 16 x "
               "dp 1 x accum 1, host vm</td></tr>") != std::string::npos);
  CHECK(h.find("<td>no end record</td><td>the job above was killed or crashed") != std::string::npos);
  CHECK(h.find("<td>resumed from step 6</td>") != std::string::npos);
  CHECK(h.find("<td>recipe_changed</td><td>fields optimizer.lr</td>") != std::string::npos);
  CHECK(h.find("<td>ended: done</td><td>step 12, exit code 0</td>") != std::string::npos);
  CHECK(h.find("class=\"t\">Loss (dashed: resumed)") != std::string::npos);
  CHECK(count(h, "class=\"resume\"") == 1);
  // A run of one job has no resume line.
  REQUIRE(report(src).code == 0);
  CHECK(slurp(src / "report.html").find("class=\"resume\"") == std::string::npos);
  CHECK(slurp(src / "report.html").find("<td>started</td>") != std::string::npos);
}

TEST_CASE("report: the wall time sums every job of a resumed run, a crashed job by the steps it kept") {
  using nlohmann::json;
  // Job 1 ran 100 s and was stopped (end record) at step 40; job 2 crashed with no end record
  // after steps 41-60 (1.5 s each, kept up to step 55, where job 3 resumed); job 3 ran 50 s.
  const std::vector<json> events{
      {{"event", "start"}, {"time", "2026-12-03T12:00:00Z"}, {"resumed_from", -1}},
      {{"event", "end"}, {"time", "2026-12-03T12:01:40Z"}, {"step", 40}},
      {{"event", "start"}, {"time", "2026-12-03T12:05:00Z"}, {"resumed_from", 40}},
      {{"event", "start"}, {"time", "2026-12-03T13:00:00Z"}, {"resumed_from", 55}},
      {{"event", "end"}, {"time", "2026-12-03T13:00:50Z"}, {"step", 80}}};
  std::vector<json> steps;
  for (int s = 1; s <= 80; ++s) steps.push_back({{"step", s}, {"interval_ms", 1500.0}});
  const runner::report::JobsWall w = runner::report::jobs_wall(events, steps);
  CHECK(w.jobs == 3);
  CHECK(w.wall_s == doctest::Approx(100 + 15 * 1.5 + 50));
  // The summary row says both: all jobs, and the last one's own figure.
  const json summary{{"summary", true}, {"wall_s", 48.0}, {"jobs", w.jobs}, {"all_jobs_wall_s", w.wall_s}};
  bool found = false;
  for (const auto& [label, text] : runner::report::summary_rows(summary, json::object()))
    if (label == "wall time") {
      found = true;
      CHECK(text.find("over 3 jobs") != std::string::npos);
      CHECK(text.find("(the last: 48") != std::string::npos);
    }
  CHECK(found);
  // One job: its own figure, as before.
  CHECK(runner::report::jobs_wall({events[0], events[1]}, steps).jobs == 1);
}
