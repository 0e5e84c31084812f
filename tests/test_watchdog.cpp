// The watchdog (runner/train/watchdog.h) end to end, on two ranks under mpirun with a
// 4 s collective timeout: a rank stopped with SIGSTOP is named by the other (rank, host,
// operation, group) and the job exits 5 within the timeout + 10 s, and the same command then
// resumes to the losses of an uninterrupted run; a rank stuck in its data loader is reported;
// a checkpoint slower than the timeout is not a hang; a single-rank run derives its timeout
// from the model and then from its measured steps, and ends cleanly. Plus the timeout's
// derivation and the "who did not arrive" classification as units. The comm layer's marks
// themselves are tests/mpi/test_mpi_watch.cpp.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/train/watchdog.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const test_support::TempDir kScratch("test_watchdog");

std::string recipe() {
  static const fs::path p = test_support::write_layout_recipe(kScratch.path);
  return p.string();
}

// Two ranks of the layout recipe (dp 2) with a 4 s timeout; `env` in front, `sets` after.
std::string two_ranks(const fs::path& dir, const std::string& env, const std::string& sets) {
  return env + " " + test_support::mpirun(2) + RUNNER_BINARY + " train " + recipe() + " --quiet --run-dir " + dir.string() +
         " --set train.collective_timeout=4 " + sets;
}

std::vector<json> events(const fs::path& dir, const std::string& kind) {
  std::vector<json> out;
  std::ifstream in(dir / "events.jsonl");
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == kind) out.push_back(j);
  }
  return out;
}

std::string hostname() {
  char h[256] = {0};
  gethostname(h, sizeof(h) - 1);
  return h;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// two_ranks(dir, env, sets) run to its end: what it printed and returned, and the seconds it took.
struct Timed {
  test_support::Result r;
  double took = 0;
};
Timed two_ranks_timed(const fs::path& dir, const std::string& env, const std::string& sets) {
  const auto t0 = std::chrono::steady_clock::now();
  test_support::Result r = test_support::sh(two_ranks(dir, env, sets));
  return {r, seconds_since(t0)};
}

// Starts `cmd` on another thread, waits for rank 1's heartbeat to satisfy `when`, stops rank 1
// with SIGSTOP and waits for the job: its result, rank 1's pid and the seconds from the stop to
// the job's end.
struct Stopped {
  test_support::Result r;
  int pid = 0;
  double took = 0;
  bool outlived = false;  // the stopped rank still existed once the job had returned
};

// Whether process `pid` exists and is no zombie, at some moment within `grace_s` seconds:
// false once it is gone for good.
bool alive(int pid, double grace_s = 2.0) {
  if (pid <= 0) return false;
  for (double waited = 0; waited <= grace_s; waited += 0.1) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) return false;
    const size_t p = line.rfind(')');
    if (p != std::string::npos && p + 2 < line.size() && line[p + 2] == 'Z') return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}
Stopped stop_rank1(const fs::path& dir, const std::string& cmd, const std::function<bool(const runner::Heartbeat&)>& when) {
  Stopped s;
  std::thread job([&] { s.r = test_support::sh(cmd); });
  for (int i = 0; i < 3000 && s.pid == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto h = runner::read_heartbeat(dir.string(), 1);
    if (h && h->phase != "done" && when(*h)) s.pid = h->pid;
  }
  if (s.pid > 0) kill(s.pid, SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  job.join();
  s.took = seconds_since(t0);
  s.outlived = alive(s.pid);
  if (s.pid > 0) kill(s.pid, SIGCONT);  // the launcher killed it; in case it did not, let it die
  return s;
}

// The uninterrupted run the resumed one is compared with (12 steps, checkpoints every 5).
const fs::path& straight() {
  static const fs::path dir = [] {
    fs::path d = kScratch.path / "straight";
    test_support::Result r = test_support::sh(two_ranks(d, "", "--set train.steps=12"));
    INFO(r.out);
    REQUIRE(r.code == 0);
    return d;
  }();
  return dir;
}

}  // namespace

TEST_CASE("the timeout: the recipe's wins; else 10x the predicted, then the measured step, never under 60 s") {
  using runner::choose_timeout;
  CHECK(choose_timeout(4, 30, 8).seconds == 4);
  CHECK(choose_timeout(4, 30, 8).source == "train.collective_timeout");
  CHECK_FALSE(choose_timeout(4, 30, 8).from_model);
  CHECK(choose_timeout(0, 0.2, 0).seconds == runner::kTimeoutFloorS);  // a fast step: the floor
  CHECK(choose_timeout(0, 30, 0).seconds == 300);                      // 10x the predicted step
  CHECK(choose_timeout(0, 30, 0).source.find("predicted") != std::string::npos);
  CHECK(choose_timeout(0, 30, 8).seconds == 80);  // the measured step replaces the prediction
  CHECK(choose_timeout(0, 30, 8).source.find("measured") != std::string::npos);
  CHECK(choose_timeout(0, 0, 0).seconds == runner::kTimeoutFloorS);  // nothing known: the floor
  CHECK(choose_timeout(0, 0, 0).from_model);
  // A stopped rank's heartbeat goes stale well inside the timeout, after several missed beats.
  for (double t : {1.0, 4.0, 60.0, 600.0, 3600.0}) {
    CAPTURE(t);
    CHECK(runner::heartbeat_stale_after(t) < t);
    CHECK(runner::heartbeat_stale_after(t) >= 3 * runner::heartbeat_interval(t));
    CHECK(runner::heartbeat_stale_after(t) <= 10.0);
  }
}

TEST_CASE("who did not arrive: a stale heartbeat is stopped, a fresh one elsewhere is named, one waiting on the call arrived") {
  parallel::WaitInfo w;
  w.active = true;
  w.op = parallel::CommOp::Allreduce;
  w.group = "dp";
  w.ranks = {0, 1, 4};
  w.seq = 12;
  const double now = 1000;
  auto beat = [&](int rank, double age, const char* phase, json wait) {
    runner::Heartbeat h;
    h.rank = rank;
    h.host = "node" + std::to_string(rank);
    h.phase = phase;
    h.step = 7;
    h.time = now - age;
    h.wait = std::move(wait);
    return std::optional<runner::Heartbeat>(h);
  };
  const json same{{"op", "allreduce"}, {"group", "dp"}, {"seq", 12}};
  const json other{{"op", "allreduce"}, {"group", "dp"}, {"seq", 11}};
  const json missing = runner::not_arrived(w, 0, {0, 1, 2, 3},
                                           {std::nullopt, beat(1, 0.3, "forward/backward", same),
                                            beat(2, 9.0, "data", same), beat(3, 0.2, "optimizer", other)},
                                           now, 2.0);
  REQUIRE(missing.size() == 2);  // rank 1 arrived (waits on call #12 of dp)
  CHECK(missing[0]["rank"] == 2);
  CHECK(missing[0]["state"] == "stopped");  // waiting on the same call, but its heartbeat is 9 s old
  CHECK(missing[0]["host"] == "node2");
  CHECK(missing[1]["rank"] == 3);
  CHECK(missing[1]["state"] == "elsewhere");
  CHECK(missing[1]["phase"] == "optimizer");
}

TEST_CASE("a rank stopped with SIGSTOP is named within the timeout + 10 s, exit 5; the same command resumes to the uninterrupted run's losses") {
  const fs::path& ref = straight();
  const fs::path dir = kScratch.path / "sigstop";
  // Rank 1 is stopped after its first steps and after the step-5 checkpoint. It sleeps 300 ms
  // after each step, so rank 0 is mostly waiting for it in the checkpoint's collective "is a
  // save due" (a wait inside this rank's own checkpoint phase must still be judged).
  Stopped st = stop_rank1(dir, two_ranks(dir, "RUNNER_FAULT_STEP_SLEEP_MS=300 RUNNER_FAULT_STEP_SLEEP_RANK=1", "--set train.steps=12"),
                          [](const runner::Heartbeat& h) { return h.step >= 7; });
  REQUIRE(st.pid > 0);
  const test_support::Result& r = st.r;
  const int pid = st.pid;
  INFO(r.out);
  CHECK(r.code == runner::kExitHang);
  CHECK(st.took < 4 + 10);
  MESSAGE("SIGSTOP to exit: " << st.took << " s (timeout 4 s)");
  CHECK(r.out.find("watchdog: rank 0") != std::string::npos);
  CHECK(r.out.find("rank 1 (host " + hostname()) != std::string::npos);
  CHECK(r.out.find("heartbeat stopped") != std::string::npos);
  // The stopped rank does not outlive the job: the launcher's SIGTERM never reaches a stopped
  // process, so the rank that stops the job wakes it, and it ends.
  CHECK_FALSE(st.outlived);
  CHECK(r.out.find("woken (SIGCONT), so that it ends with the job") != std::string::npos);
  const std::vector<json> hangs = events(dir, "hang");
  REQUIRE(hangs.size() == 1);
  const json& h = hangs[0];
  CHECK(h["rank"] == 0);
  CHECK(h["kind"] == "wait");
  CHECK(!h.value("op", "").empty());
  CHECK((h["group"] == "dp" || h["group"] == "world"));
  CHECK(h["members"] == json::array({0, 1}));
  REQUIRE(h["not_arrived"].size() == 1);
  CHECK(h["not_arrived"][0]["rank"] == 1);
  CHECK(h["not_arrived"][0]["host"] == hostname());
  CHECK(h["not_arrived"][0]["state"] == "stopped");
  CHECK(h["not_arrived"][0]["pid"] == pid);
  const std::vector<json> ends = events(dir, "end");
  REQUIRE(!ends.empty());
  CHECK(ends.back()["exit_code"] == runner::kExitHang);
  CHECK(ends.back()["cause"].get<std::string>().find("hang: rank 1") == 0);

  // The restart: the same command continues from the last checkpoint, bit for bit.
  test_support::Result again = test_support::sh(two_ranks(dir, "", "--set train.steps=12"));
  INFO(again.out);
  REQUIRE(again.code == 0);
  const auto la = test_support::step_losses(ref), lb = test_support::step_losses(dir);
  REQUIRE(la.count(12));
  REQUIRE(lb.count(12));
  for (const auto& [step, loss] : la) {
    CAPTURE(step);
    REQUIRE(lb.count(step));
    CHECK(lb.at(step) == loss);
  }
}

// Two ranks with a 60 s timeout (only the dead process itself, not the timeout, can explain a
// quick stop), `env` in front; rank 1 is killed with SIGKILL once rank 0's heartbeat satisfies
// `when`. Then the survivor must have named it (rank, host, pid) in its own words, not only
// mpirun's, in one hang record, and no rank outlives the job.
void check_killed_rank1_named(const fs::path& dir, const std::string& env,
                              const std::function<bool(const runner::Heartbeat&)>& when) {
  const std::string cmd = test_support::mpirun(2) + RUNNER_BINARY + " train " + recipe() + " --quiet --run-dir " +
                          dir.string() + " --set train.collective_timeout=60 train.steps=400";
  test_support::Result r;
  std::thread job([&] { r = test_support::sh(env + " " + cmd); });
  int victim = 0, survivor = 0;
  for (int i = 0; i < 3000 && (victim == 0 || survivor == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto h1 = runner::read_heartbeat(dir.string(), 1), h0 = runner::read_heartbeat(dir.string(), 0);
    if (h1 && h0 && h1->step >= 3 && when(*h0)) victim = h1->pid, survivor = h0->pid;
  }
  if (victim > 0) kill(victim, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  job.join();
  REQUIRE(victim > 0);
  const double took = seconds_since(t0);
  INFO(r.out);
  MESSAGE("SIGKILL to the job's end: " << took << " s (timeout 60 s)");
  CHECK(took < 30);
  CHECK_FALSE(alive(survivor));
  CHECK(r.out.find("watchdog: rank 0") != std::string::npos);
  CHECK(r.out.find("rank 1 (host " + hostname() + ", pid " + std::to_string(victim) + ") is gone") != std::string::npos);
  const std::vector<json> hangs = events(dir, "hang");
  REQUIRE(hangs.size() == 1);
  CHECK(hangs[0]["rank"] == 0);
  REQUIRE(hangs[0]["not_arrived"].size() == 1);
  CHECK(hangs[0]["not_arrived"][0]["rank"] == 1);
  CHECK(hangs[0]["not_arrived"][0]["state"] == "gone");
  CHECK(hangs[0]["not_arrived"][0]["pid"] == victim);
  const std::vector<json> ends = events(dir, "end");
  REQUIRE(!ends.empty());
  CHECK(ends.back()["exit_code"] == runner::kExitHang);
  CHECK(ends.back()["cause"].get<std::string>().find("is gone") != std::string::npos);
}

TEST_CASE("a rank killed with SIGKILL: the survivor names it (rank, host, pid) long before the timeout, exit 5; no rank outlives the job") {
  // Rank 1 is the slow one, so rank 0 mostly waits for it in a collective.
  check_killed_rank1_named(kScratch.path / "sigkill", "RUNNER_FAULT_STEP_SLEEP_MS=100 RUNNER_FAULT_STEP_SLEEP_RANK=1",
                           [](const runner::Heartbeat&) { return true; });
}

TEST_CASE("a rank killed while the survivor writes its checkpoint: named in the second between mpirun's SIGTERM and SIGKILL") {
  // Rank 0's step-5 save takes 5 s longer and marks no collective: mpirun sees rank 1 die,
  // sends rank 0 SIGTERM and, a second later, SIGKILL. Only the stop signal can tell rank 0 to look.
  check_killed_rank1_named(kScratch.path / "sigkill_checkpoint", "RUNNER_FAULT_CKPT_SLEEP_MS=5000 RUNNER_FAULT_CKPT_SLEEP_RANK=0",
                           [](const runner::Heartbeat& h0) { return h0.phase == "checkpoint" && h0.step == 5; });
}

TEST_CASE("a rank stopped inside its checkpoint write is named too: a stale heartbeat exempts nothing") {
  const fs::path dir = kScratch.path / "sigstop_checkpoint";
  // Rank 1's step-5 save takes 3 s longer, so the stop lands in it; rank 0 waits for it meanwhile.
  Stopped st = stop_rank1(dir, two_ranks(dir, "RUNNER_FAULT_CKPT_SLEEP_MS=3000 RUNNER_FAULT_CKPT_SLEEP_RANK=1", "--set train.steps=6"),
                          [](const runner::Heartbeat& h) { return h.phase == "checkpoint" && h.step == 5; });
  REQUIRE(st.pid > 0);
  INFO(st.r.out);
  CHECK(st.r.code == runner::kExitHang);
  CHECK(st.took < 4 + 10);
  const std::vector<json> hangs = events(dir, "hang");
  REQUIRE(hangs.size() == 1);
  REQUIRE(hangs[0]["not_arrived"].size() == 1);
  CHECK(hangs[0]["not_arrived"][0]["rank"] == 1);
  CHECK(hangs[0]["not_arrived"][0]["state"] == "stopped");
  CHECK(hangs[0]["not_arrived"][0]["phase"] == "checkpoint");
}

TEST_CASE("a rank stuck in its data loader is reported: exit 5, rank 1 named") {
  const fs::path dir = kScratch.path / "stall";
  // Rank 1 sleeps 60 s after its data wait at step 6 (the other rank waits for it in the step's first collective).
  const Timed t =
      two_ranks_timed(dir, "RUNNER_DEBUG_STALL_RANK=1 RUNNER_DEBUG_STALL_EVERY=6 RUNNER_DEBUG_STALL_MS=60000", "--set train.steps=8");
  const test_support::Result& r = t.r;
  INFO(r.out);
  CHECK(r.code == runner::kExitHang);
  CHECK(t.took < 40);  // not the 60 s stall
  const std::vector<json> hangs = events(dir, "hang");
  REQUIRE(!hangs.empty());
  for (const json& h : hangs) {  // rank 0 names rank 1 as elsewhere, or rank 1 reports itself stalled
    CAPTURE(h.dump());
    CHECK(h["step"] == 6);
    // First rank 1 (a rank that exited meanwhile may follow it, stopped).
    REQUIRE(!h["not_arrived"].empty());
    CHECK(h["not_arrived"][0]["rank"] == 1);
    CHECK(h["not_arrived"][0]["phase"] == "data");
    CHECK((h["kind"] == "stall" ? h["rank"] == 1 : h["not_arrived"][0]["state"] == "elsewhere"));
  }
  CHECK(r.out.find("rank 1") != std::string::npos);
}

TEST_CASE("a checkpoint slower than the timeout is not a hang: the run finishes") {
  const fs::path dir = kScratch.path / "slow_checkpoint";
  // Rank 1's step-5 save takes 5 s longer; rank 0 waits for it in the next collective meanwhile.
  const Timed t = two_ranks_timed(dir, "RUNNER_FAULT_CKPT_SLEEP_MS=5000 RUNNER_FAULT_CKPT_SLEEP_RANK=1", "--set train.steps=6");
  const test_support::Result& r = t.r;
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(t.took > 5);  // the slow save happened
  CHECK(events(dir, "hang").empty());
  REQUIRE(!events(dir, "end").empty());
  CHECK(events(dir, "end").back()["cause"] == "done");
}

TEST_CASE("one rank: the timeout comes from the model, then from the measured steps; the watchdog ends with the run") {
  const fs::path dir = kScratch.path / "single";
  test_support::Result r = test_support::sh(test_support::launcher(0) + RUNNER_BINARY + " train " + recipe() +
                                            " --run-dir " + dir.string() + " --set train.steps=8");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("watchdog: collective timeout 60 s") != std::string::npos);  // the banner
  const std::vector<json> w = events(dir, "watchdog");
  REQUIRE(w.size() == 2);
  CHECK(w[0]["timeout_s"] == runner::kTimeoutFloorS);
  CHECK(w[1]["source"].get<std::string>().find("measured") != std::string::npos);
  CHECK(w[1]["timeout_s"] == runner::kTimeoutFloorS);  // this model's steps are far under 6 s
  auto h = runner::read_heartbeat(dir.string(), 0);
  REQUIRE(h);
  CHECK(h->phase == "done");  // the last heartbeat, written after the thread was joined
  CHECK(h->wait.is_null());
}
