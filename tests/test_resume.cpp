// Bitwise resume (invariant 3) and preemption, through the real binary.
//
// One recipe (the quickstart, 30 steps, a checkpoint every 10) is trained three ways:
// straight through; killed with SIGKILL mid-step after the step-20 checkpoint and resumed
// with `runner resume`; stopped with SIGTERM (and with Ctrl-C, SIGINT) and restarted with the
// same `runner train` command line. The final checkpoints must hold byte-identical tensors and the per-step
// losses after the resume must equal the straight run's exactly.
#include <doctest/doctest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/checkpoint_files.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;

namespace {

const std::string kArgs = std::string(RUNNER_SOURCE_DIR) +
                          "/recipes/quickstart.yaml --quiet --set train.steps=30 --set checkpoint.every_steps=10 "
                          "--set checkpoint.keep_last=10 --set train.eval_every=0 --set model.dropout=0.1";

using test_support::split;
using test_support::wait_exit;

pid_t spawn(const std::vector<std::string>& args) { return test_support::spawn_runner(args); }

// `runner train` of the recipe into `run_dir`, started (not waited for).
pid_t spawn_train(const std::string& run_dir) { return spawn(split("train " + kArgs + " --run-dir " + run_dir)); }

int train(const std::string& run_dir) { return wait_exit(spawn_train(run_dir)); }

std::string read_file(const fs::path& p) { return test_support::slurp(p); }

// Every dataset under /params and /optimizer, as raw bytes.
std::map<std::string, std::vector<char>> tensors(const fs::path& file) {
  std::map<std::string, std::vector<char>> out;
  for (auto& [name, data] : test_support::checkpoint_datasets(file)) out[name] = std::move(data.first);
  return out;
}

void require_same_final(const fs::path& a, const fs::path& b) {
  auto fa = a / "checkpoints" / "step_00000030.h5", fb = b / "checkpoints" / "step_00000030.h5";
  REQUIRE(fs::exists(fa));
  REQUIRE(fs::exists(fb));
  auto ta = tensors(fa), tb = tensors(fb);
  REQUIRE(ta.size() == tb.size());
  REQUIRE(ta.size() > 10);
  for (auto& [name, bytes] : ta) {
    CAPTURE(name);
    REQUIRE(tb.count(name));
    CHECK(bytes == tb[name]);
  }
  auto la = test_support::step_losses(a), lb = test_support::step_losses(b);
  REQUIRE(la.size() == 30);
  REQUIRE(lb.size() == 30);
  for (auto& [step, loss] : la) {
    CAPTURE(step);
    CHECK(lb[step] == loss);  // exact, bit for bit
  }
}

bool losses_count_at_least(const fs::path& run_dir, size_t n) {
  std::ifstream m(run_dir / "metrics.jsonl");
  size_t count = 0;
  for (std::string line; std::getline(m, line);) count += line.find("\"loss\"") != std::string::npos;
  return count >= n;
}

fs::path fresh(const std::string& name) { return test_support::fresh_dir("resume", name); }

fs::path straight_run() {
  static fs::path dir;
  if (dir.empty()) {
    dir = fresh("straight");
    REQUIRE(train(dir.string()) == 0);
  }
  return dir;
}

}  // namespace

TEST_CASE("SIGKILL mid-step after the step-20 checkpoint, then `runner resume`: bit-identical") {
  fs::path ref = straight_run();
  fs::path dir = fresh("killed");
  pid_t pid = spawn_train(dir.string());
  fs::path latest = dir / "checkpoints" / "LATEST";
  const bool killed = test_support::signal_when(
      pid, SIGKILL, [&] { return fs::exists(latest) && read_file(latest).find("step_00000020") != std::string::npos; }, 200000);
  REQUIRE(killed);
  CHECK(wait_exit(pid) == 128 + SIGKILL);
  CHECK_FALSE(fs::exists(dir / "checkpoints" / "step_00000030.h5"));
  auto resume = split("resume " + dir.string() + " --quiet");
  REQUIRE(wait_exit(spawn(resume)) == 0);
  require_same_final(ref, dir);
}

TEST_CASE("SIGTERM and Ctrl-C (SIGINT): checkpoint at the next step boundary, exit code 3, the same command resumes bit-exact") {
  fs::path ref = straight_run();
  for (int sig : {SIGTERM, SIGINT}) {
    CAPTURE(sig);
    fs::path dir = fresh(sig == SIGTERM ? "term" : "int");
    pid_t pid = spawn_train(dir.string());
    // Wait until a few steps are logged, past the step-10 checkpoint, then ask it to stop.
    for (int i = 0; i < 600000; ++i) {
      if (losses_count_at_least(dir, 13)) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    kill(pid, sig);
    int code = wait_exit(pid);
    REQUIRE(code == 3);
    // A checkpoint beyond step 10 was written at a step boundary.
    std::string latest = read_file(dir / "checkpoints" / "LATEST");
    CHECK(latest.find("step_00000010") == std::string::npos);
    REQUIRE(train(dir.string()) == 0);
    require_same_final(ref, dir);
  }
}

TEST_CASE("in-memory snapshot tier: a non-finite loss rolls back and skips the batch, without touching disk") {
  fs::path dir = fresh("rollback");
  std::string cmd = std::string("RUNNER_FAULT_NAN_STEP=13 ") + RUNNER_BINARY + " train " + std::string(RUNNER_SOURCE_DIR) +
                    "/recipes/quickstart.yaml --quiet --set train.steps=20 --set checkpoint.every_steps=100 "
                    "--set checkpoint.snapshot_every=5 --set train.eval_every=0 --run-dir " + dir.string();
  const test_support::Result r = test_support::sh(cmd);
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream m(dir / "metrics.jsonl");
  int rollbacks = 0;
  std::vector<int64_t> steps;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("rollback")) {
      rollbacks++;
      CHECK(j["step"] == 13);
      CHECK(j["to_step"] == 10);
    } else if (j.contains("loss") && !j.contains("eval")) {
      CHECK(std::isfinite(j["loss"].get<double>()));
      steps.push_back(j["step"]);
    }
  }
  CHECK(rollbacks == 1);
  // Steps 11 and 12 ran twice (before and after the rollback); the run still ends at 20.
  CHECK(steps.back() == 20);
  CHECK(std::count(steps.begin(), steps.end(), 11) == 2);
  // Only the final checkpoint was written: the rollback never touched disk.
  auto files = std::distance(fs::directory_iterator(dir / "checkpoints"), fs::directory_iterator{});
  CHECK(files == 2);  // step_00000020.h5 and LATEST
  std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("rolling back to the in-memory snapshot of step 10") != std::string::npos);
  CHECK(log.find("skipping the batch") != std::string::npos);
}
