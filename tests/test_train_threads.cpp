// The same numbers on any thread count, through the real binary: training at 1, 2
// and 3 OpenMP threads gives bit-identical losses and checkpoints (fp32 and bf16, with dropout),
// and a run resumed at another thread count continues bit for bit. The kernels' side of it
// (fixed blocking of every reduction) is tests/test_ops_threads.cpp.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runner/observe/slow_steps.h"
#include "tests/support/checkpoint_files.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::TempDir kScratch("test_train_threads");

// The quickstart with dropout, a checkpoint every `every` steps, no evaluation.
std::string args(const std::string& prec, int steps, int every) {
  return test_support::quickstart_recipe() + " --quiet --set train.eval_every=0 --set model.dropout=0.1 --set train.steps=" +
         std::to_string(steps) + " --set checkpoint.every_steps=" + std::to_string(every) +
         " --set checkpoint.keep_last=10 --set precision.compute=" + prec;
}

int run(const std::string& a, const std::vector<std::string>& env = {}) {
  return test_support::wait_exit(test_support::spawn_runner(test_support::split(a), env));
}

// Every /params and /optimizer dataset of both files, byte for byte.
void same_checkpoint(const fs::path& a, const fs::path& b) { test_support::check_same_datasets(a, b); }

}  // namespace

TEST_CASE("1, 2 and 3 threads train to bit-identical losses and checkpoints (fp32 and bf16, dropout on)") {
  for (const char* prec : {"fp32", "bf16"}) {
    CAPTURE(prec);
    std::map<int, fs::path> dirs;
    for (int t : {1, 2, 3}) {
      dirs[t] = kScratch / (std::string(prec) + "_t" + std::to_string(t));
      // train.threads for 1 and 3, OMP_NUM_THREADS for 2: both ways of choosing the count
      const std::string threads = t == 2 ? "" : " --set train.threads=" + std::to_string(t);
      REQUIRE(run("train " + args(prec, 3, 3) + threads + " --run-dir " + dirs[t].string(),
                  t == 2 ? std::vector<std::string>{"OMP_NUM_THREADS=2"} : std::vector<std::string>{}) == 0);
    }
    const auto ref = test_support::step_losses(dirs[1], true);
    REQUIRE(ref.size() == 3);
    for (int t : {2, 3}) {
      CAPTURE(t);
      CHECK(test_support::step_losses(dirs[t], true) == ref);  // doubles compared exactly
      same_checkpoint(dirs[1] / "checkpoints" / "step_00000003.h5", dirs[t] / "checkpoints" / "step_00000003.h5");
    }
  }
}

TEST_CASE("a run resumed at another thread count continues bit for bit, without a warning") {
  for (const char* prec : {"fp32", "bf16"}) {
    CAPTURE(prec);
    const fs::path straight = kScratch / (std::string("straight_") + prec), resumed = kScratch / (std::string("resumed_") + prec);
    REQUIRE(run("train " + args(prec, 4, 2) + " --run-dir " + straight.string(), {"OMP_NUM_THREADS=2"}) == 0);
    // The first half at 2 threads, the second resumed at 1.
    REQUIRE(run("train " + args(prec, 2, 2) + " --run-dir " + resumed.string(), {"OMP_NUM_THREADS=2"}) == 0);
    REQUIRE(run("resume " + resumed.string() + " --quiet --set train.steps=4", {"OMP_NUM_THREADS=1"}) == 0);
    CHECK(test_support::slurp(resumed / "log.rank0.txt").find("OpenMP thread") == std::string::npos);
    same_checkpoint(straight / "checkpoints" / "step_00000004.h5", resumed / "checkpoints" / "step_00000004.h5");
    const auto a = test_support::step_losses(straight, true), b = test_support::step_losses(resumed, true);
    REQUIRE(a.size() == 4);
    CHECK(b == a);
  }
}

TEST_CASE("passive waiting is the default; a wait policy or spin count the user set stands") {
  const fs::path dir = kScratch.path / "wait_policy";
  struct Case {
    std::string env, want;
  } cases[] = {{"", "OMP_WAIT_POLICY=PASSIVE"},
               {"OMP_WAIT_POLICY=active", "OMP_WAIT_POLICY=active"},
               {"GOMP_SPINCOUNT=300000", "the runtime's wait policy"}};
  int i = 0;
  for (const Case& c : cases) {
    CAPTURE(c.env);
    const fs::path run = dir / std::to_string(i++);
    const test_support::Result r = test_support::sh("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + c.env + " " +
                                                    test_support::binary() + " " +
                                                    test_support::tiny_quickstart_args(run, 2, 32) + " train.threads=2 2>&1");
    INFO(r.out);
    REQUIRE(r.code == 0);
    const std::string log = test_support::slurp(run / "log.rank0.txt");
    INFO(log);
    CHECK(log.find("threads    2 (OpenMP, " + c.want + ";") != std::string::npos);
  }
}

TEST_CASE("steps far slower than planned: one warning naming the load, the threads and the fix") {
  runner::MachineLoad busy{9.5, 2, 2, ""};
  int asked = 0;
  auto machine = [&] {
    ++asked;
    return busy;
  };
  runner::SlowStepCheck check(0.1);
  // The warm-up steps are not judged, however slow.
  for (int i = 0; i < runner::SlowStepCheck::kWarmup; ++i) CHECK_FALSE(check.step(5.0, machine));
  // A slow run broken by a step within the factor starts the count again.
  for (int i = 0; i < runner::SlowStepCheck::kSteps - 1; ++i) CHECK_FALSE(check.step(1.0, machine));
  CHECK_FALSE(check.step(0.25, machine));
  for (int i = 0; i < runner::SlowStepCheck::kSteps - 1; ++i) CHECK_FALSE(check.step(1.0, machine));
  CHECK(asked == 0);
  const auto w = check.step(1.0, machine);
  REQUIRE(w);
  CHECK(asked == 1);
  CHECK(w->find("10.0x slower than planned") != std::string::npos);
  CHECK(w->find("load average 9.5 on 2 core(s)") != std::string::npos);
  CHECK(w->find("2 OpenMP thread(s)") != std::string::npos);
  CHECK(w->find("--set train.threads=1") != std::string::npos);
  CHECK_FALSE(check.step(1.0, machine));  // once
  // Within the factor: no warning.
  runner::SlowStepCheck edge(0.1);
  for (int i = 0; i < 20; ++i) CHECK_FALSE(edge.step(0.29, machine));
  // An idle machine: the prediction is suspect, not the load; active spinning is named when set.
  CHECK(check.message(1.0, {0.4, 4, 2, ""}).find("not busy") != std::string::npos);
  CHECK(check.message(1.0, {12.0, 4, 4, "ACTIVE"}).find("unset OMP_WAIT_POLICY=active") != std::string::npos);
  // One thread already: no advice to use one thread.
  const std::string one = check.message(1.0, {9.0, 1, 1, ""});
  CHECK(one.find("train.threads") == std::string::npos);
  CHECK(one.find("one OpenMP thread already") != std::string::npos);
  // No prediction: never.
  runner::SlowStepCheck none(0);
  for (int i = 0; i < 20; ++i) CHECK_FALSE(none.step(100.0, machine));
}
