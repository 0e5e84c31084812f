// The trace files of a profiled run (--profile), through the real binary on 1 rank, dp2, tp2
// and pp2: valid Chrome trace-event JSON; per profiled step, every call the communicators made
// is an event (compared with their own counters, written to profile.rankR.json, and with what
// the layout implies: the gradient buckets, one send and one receive per micro-batch between
// pipeline stages, tensor-parallel collectives inside the operators that make them); the
// data wait, the optimizer and the checkpoint that falls in the window are events; the
// pipeline's idle waits (the bubble) and the non-blocking all-reduces (hidden behind the
// backward) have their own events. And the end-of-run top-operators table counts the
// training passes only: its times sum to at most the measured forward and backward time.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const test_support::TempDir kScratch("test_trace");
const fs::path& kDir = kScratch.path;
using test_support::slurp;

constexpr int kFrom = 4, kTo = 6;  // the profiled steps; the layout recipe checkpoints at step 5

// The layout-test model (global 8, micro 2, checkpoint every 5 steps), 6 steps, profiled 4:6,
// a monitor record at each step line (every 5th step and the last).
fs::path run(const std::string& name, int np, const std::string& sets) {
  static std::map<std::string, fs::path> made;
  if (made.count(name)) return made[name];
  const fs::path recipe = test_support::write_layout_recipe(kDir), dir = kDir / name;
  const std::string cmd = test_support::launcher(np > 1 ? np : 0) + RUNNER_BINARY + " train " + recipe.string() +
                          " --quiet --run-dir " + dir.string() + " --set train.steps=6 --set train.monitor_every=5 --profile 4:6 " + sets;
  test_support::Result r = test_support::sh(cmd);
  INFO(cmd << "\n" << r.out);
  REQUIRE(r.code == 0);
  return made[name] = dir;
}

bool is_comm(const json& e) { return e.contains("cat") && (e["cat"] == "comm" || e["cat"] == "p2p"); }

struct RankTrace {
  json trace, profile;
  std::map<int, std::pair<double, double>> step_span;                 // step -> [ts, ts + dur]
  std::map<int, std::map<std::string, int64_t>> comm_events;          // step -> "group op" -> events
  std::map<int, std::map<std::string, int64_t>> named;                // step -> event name -> count (X events)
  std::vector<json> ops, comm, spans;                                 // operator, communication, other X events
};

// Parses trace.rankR.json and checks it is well-formed trace-event JSON: every event has a
// phase, a pid (the rank) and a name; complete events a ts, a dur >= 0, a category and the
// step in args; async begin/end events pair up by id, end after begin.
RankTrace load(const fs::path& dir, int rank) {
  RankTrace t;
  t.trace = json::parse(slurp(dir / ("trace.rank" + std::to_string(rank) + ".json")));
  t.profile = json::parse(slurp(dir / ("profile.rank" + std::to_string(rank) + ".json")));
  REQUIRE(t.trace["traceEvents"].is_array());
  std::map<int64_t, json> open;
  std::set<int64_t> closed;
  for (auto& e : t.trace["traceEvents"]) {
    REQUIRE(e["ph"].is_string());
    CHECK(e["pid"] == rank);
    REQUIRE(e["name"].is_string());
    const std::string ph = e["ph"];
    if (ph == "M") continue;
    REQUIRE(e["ts"].is_number());
    REQUIRE(e["cat"].is_string());
    if (ph == "e") {
      const int64_t id = e["id"];
      REQUIRE(open.count(id));
      CHECK(open[id]["name"] == e["name"]);
      CHECK(e["ts"].get<double>() >= open[id]["ts"].get<double>());
      open.erase(id);
      CHECK(closed.insert(id).second);
      continue;
    }
    REQUIRE(e["args"]["step"].is_number_integer());
    const int step = e["args"]["step"];
    if (ph == "b") {
      CHECK(is_comm(e));
      CHECK(open.emplace(e["id"].get<int64_t>(), e).second);
      CHECK(e["args"]["exposed_ms"].get<double>() >= 0);
      CHECK(e["args"]["hidden_ms"].get<double>() >= 0);
    } else {
      REQUIRE(ph == "X");
      CHECK(e["dur"].get<double>() >= 0);
      t.named[step][e["name"].get<std::string>()]++;
    }
    const std::string cat = e["cat"];
    if (cat == "step") {
      t.step_span[step] = {e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    } else if (cat == "forward" || cat == "backward" || cat == "recompute") {
      t.ops.push_back(e);
    } else if (is_comm(e)) {
      const json& a = e["args"];
      CHECK(a["bytes"].get<int64_t>() >= 0);
      CHECK(e["name"].get<std::string>().rfind(a["op"].get<std::string>() + " " + a["group"].get<std::string>(), 0) == 0);
      if (cat == "p2p") {
        CHECK(a["peer"].get<int>() >= 0);
        CHECK(a["tag"].get<int>() >= 0);
      }
      t.comm_events[step][a["group"].get<std::string>() + " " + a["op"].get<std::string>()]++;
      t.comm.push_back(e);
    } else {
      t.spans.push_back(e);
    }
  }
  CHECK(open.empty());  // every async slice ended
  CHECK(t.step_span.size() == kTo - kFrom + 1);
  return t;
}

// What every layout shares: per profiled step the communication events equal the
// communicators' own counts; one data wait, gradient norm and optimizer step, inside the step;
// the checkpoint of step 5 is there and only there.
void check_common(const RankTrace& t, bool multi) {
  const json& per = t.profile["communication"]["per_step"];
  REQUIRE(per.size() == kTo - kFrom + 1);
  for (const json& s : per) {
    const int step = s["step"];
    std::map<std::string, int64_t> counted = s["calls"].get<std::map<std::string, int64_t>>();
    std::map<std::string, int64_t> events;
    if (t.comm_events.count(step)) events = t.comm_events.at(step);
    CAPTURE(step);
    CHECK(events == counted);
  }
  for (int step = kFrom; step <= kTo; ++step) {
    CAPTURE(step);
    REQUIRE(t.named.count(step));
    const auto& n = t.named.at(step);
    auto count = [&](const char* name) { return n.count(name) ? n.at(name) : 0; };
    CHECK(count("data wait") == 1);
    CHECK(count("gradient norm") == 1);
    CHECK(count("optimizer step") == 1);
    CHECK(count("zero gradients") == 1);
    CHECK(count("checkpoint save") == (step == 5 ? 1 : 0));
  }
  // Several ranks: the monitor's gather of every rank's breakdown at the log interval's end
  // (step 5) is non-blocking, completed at the next interval (here: flushed at the window's end).
  if (multi)
    for (int step = kFrom; step <= kTo; ++step) {
      CAPTURE(step);
      int64_t n = 0;
      for (const json& e : t.trace["traceEvents"])
        if (e["ph"] == "b" && e["args"]["step"] == step && e["args"]["op"] == "iallreduce" && e["args"]["group"] == "world") n++;
      CHECK(n == (step == 5 || step == kTo ? 1 : 0));  // step lines at every 5th step and the last
    }
  // The step's own phases lie inside its span (the checkpoint comes after it).
  for (const json& e : t.spans) {
    const std::string cat = e["cat"];
    if (cat == "checkpoint") continue;
    const auto& sp = t.step_span.at(e["args"]["step"].get<int>());
    CHECK(e["ts"].get<double>() >= sp.first - 1e-3);
    CHECK(e["ts"].get<double>() + e["dur"].get<double>() <= sp.second + 1e-3);
  }
  // Every event of the checkpoint's step: its save is after the step's span.
  for (const json& e : t.spans)
    if (e["name"] == "checkpoint save") CHECK(e["ts"].get<double>() >= t.step_span.at(5).second - 1e-3);
}

int64_t at(const std::map<std::string, int64_t>& m, const std::string& k) { return m.count(k) ? m.at(k) : 0; }

// The merged trace holds every rank's events, one pid per rank.
void check_merged(const fs::path& dir, int ranks) {
  json merged = json::parse(slurp(dir / "trace.json"));
  size_t total = 0;
  for (int r = 0; r < ranks; ++r)
    total += json::parse(slurp(dir / ("trace.rank" + std::to_string(r) + ".json")))["traceEvents"].size();
  CHECK(merged["traceEvents"].size() == total);
  std::set<int> pids;
  for (auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  CHECK(pids.size() == static_cast<size_t>(ranks));
}

// The number of gradient buckets rank 0's log says the run's layout has.
int gradient_buckets(const fs::path& dir) {
  const std::string log = slurp(dir / "log.rank0.txt");
  std::smatch m;
  REQUIRE(std::regex_search(log, m, std::regex("(\\d+) gradient bucket\\(s\\)")));
  return std::stoi(m[1]);
}

}  // namespace

TEST_CASE("trace: one rank has the loop's phases and no communication") {
  const fs::path dir = run("serial", 1, "");
  RankTrace t = load(dir, 0);
  check_common(t, false);
  CHECK(t.comm.empty());  // the one-rank communicator makes no calls
  for (int step = kFrom; step <= kTo; ++step) {
    CHECK(at(t.named[step], "forward mb 0") == 1);
    CHECK(at(t.named[step], "backward mb 3") == 1);  // accum 4: micro-batches 0..3
  }
  check_merged(dir, 1);
}

// The end-of-run table of top operators (metrics.jsonl's summary) counts the training passes
// only: evaluation's forwards used to be added in, so it summed to several times the measured
// forward and backward time.
TEST_CASE("top operators: the table sums to at most the measured pass time") {
  const fs::path dir = run("serial", 1, "");
  std::ifstream in(dir / "metrics.jsonl");
  double passes_ms = 0, table_ms = 0;
  int steps = 0;
  json summary;
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line);
    if (j.contains("summary")) summary = j;
    else if (j.contains("forward_ms") && j.contains("step_ms")) passes_ms += j["forward_ms"].get<double>() + j["backward_ms"].get<double>(), steps++;
  }
  REQUIRE(summary.is_object());
  CHECK(steps == 6);
  for (auto& o : summary["top_ops"]) table_ms += o["forward_ms"].get<double>() + o["backward_ms"].get<double>() + o["recompute_ms"].get<double>();
  CAPTURE(table_ms);
  CAPTURE(passes_ms);
  CHECK(table_ms > 0);
  CHECK(table_ms <= passes_ms);
  // Calls: every step runs the same passes, so the 6 steps' calls are twice the 3 profiled ones'.
  auto prof = json::parse(slurp(dir / "profile.json"));
  std::map<std::string, int64_t> profiled;
  for (auto& o : prof["ops"]) profiled[o["op"]] = o["forward"]["calls"];
  for (auto& o : summary["top_ops"]) CHECK_MESSAGE(o["calls"].get<int64_t>() == 2 * profiled[o["op"]], o["op"]);
}

TEST_CASE("trace: dp2 has every gradient bucket's all-reduce, hidden behind the backward") {
  const fs::path dir = run("dp2", 2, "--set parallel.dp=2 --set parallel.bucket_mb=0.1");
  const int buckets = gradient_buckets(dir);
  CHECK(buckets > 1);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    RankTrace t = load(dir, r);
    check_common(t, true);
    for (int step = kFrom; step <= kTo; ++step) {
      CAPTURE(step);
      CHECK(at(t.comm_events[step], "dp iallreduce") == buckets);  // one per bucket, from the layout
      CHECK(at(t.comm_events[step], "dp allreduce") == 1);         // the target-token count
      CHECK(at(t.named[step], "gradient sync wait") == 1);
    }
    int async = 0;
    for (auto& e : t.trace["traceEvents"])
      if (e["ph"] == "b" && e["args"]["group"] == "dp") {
        async++;
        CHECK(e["args"]["op"] == "iallreduce");
        CHECK(e["args"]["bytes"].get<int64_t>() > 0);
      }
    CHECK(async == buckets * (kTo - kFrom + 1));  // the rest: the monitor's gathers (check_common)
  }
  check_merged(dir, 2);
}

TEST_CASE("trace: dp2 with ZeRO-1 has a reduce-scatter and an all-gather per bucket") {
  const fs::path dir = run("zero1", 2, "--set parallel.dp=2 --set parallel.zero=1 --set parallel.bucket_mb=0.1");
  const int buckets = gradient_buckets(dir);
  RankTrace t = load(dir, 1);
  check_common(t, true);
  for (int step = kFrom; step <= kTo; ++step) {
    CAPTURE(step);
    CHECK(at(t.comm_events[step], "dp ireduce_scatter") == buckets);
    CHECK(at(t.comm_events[step], "dp iallgather") == buckets);
    CHECK(at(t.named[step], "gather parameters") == 1);
  }
}

TEST_CASE("trace: tp2's collectives are inside the tensor-parallel operators") {
  const fs::path dir = run("tp2", 2, "--set parallel.tp=2");
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    RankTrace t = load(dir, r);
    check_common(t, true);
    int tp = 0;
    for (const json& c : t.comm) {
      if (c["args"]["group"] != "tp") continue;
      tp++;
      const double a = c["ts"], b = a + c["dur"].get<double>();
      bool inside = false;
      for (const json& o : t.ops) {
        const double oa = o["ts"], ob = oa + o["dur"].get<double>();
        if (oa <= a + 1e-3 && b <= ob + 1e-3) inside = true;
      }
      CHECK_MESSAGE(inside, c.dump());
    }
    CHECK(tp > 0);
    for (int step = kFrom; step <= kTo; ++step) CHECK(at(t.comm_events[step], "tp allreduce") > 0);
  }
  check_merged(dir, 2);
}

TEST_CASE("trace: pp2 has a send and a receive per micro-batch, and the bubble") {
  const fs::path dir = run("pp2", 2, "--set parallel.pp=2");
  const int accum = 4;  // global 8 / micro 2
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    RankTrace t = load(dir, r);
    check_common(t, true);
    const std::string peer = std::to_string(1 - r);
    for (int step = kFrom; step <= kTo; ++step) {
      CAPTURE(step);
      // Stage 0 sends activations and receives gradients; stage 1 the reverse.
      CHECK(at(t.comm_events[step], "world isend") == accum);
      CHECK(at(t.comm_events[step], "world recv") == accum);
      CHECK(at(t.named[step], "recv world from " + peer) == accum);
      CHECK(at(t.named[step], r == 0 ? "idle: waiting for gradient" : "idle: waiting for activation") == accum);
      for (int k = 0; k < accum; ++k) {
        CHECK(at(t.named[step], "forward mb " + std::to_string(k)) == 1);
        CHECK(at(t.named[step], "backward mb " + std::to_string(k)) == 1);
      }
      CHECK(at(t.comm_events[step], "embed iallreduce") == 1);  // the tied embedding's two copies
    }
    // Each idle wait for a neighbour holds the receive it waited in.
    for (const json& e : t.spans) {
      if (e["cat"] != "pipeline" || e["name"].get<std::string>().find("waiting") == std::string::npos) continue;
      const double a = e["ts"], b = a + e["dur"].get<double>();
      bool holds = false;
      for (const json& c : t.comm)
        if (c["args"]["op"] == "recv" && c["ts"].get<double>() >= a - 1e-3 && c["ts"].get<double>() + c["dur"].get<double>() <= b + 1e-3)
          holds = true;
      CHECK_MESSAGE(holds, e.dump());
    }
  }
  check_merged(dir, 2);
}
