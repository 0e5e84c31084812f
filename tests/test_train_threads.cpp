// The same numbers on any thread count, through the real binary: training at 1, 2
// and 3 OpenMP threads gives bit-identical losses and checkpoints (fp32 and bf16, with dropout),
// and a run resumed at another thread count continues bit for bit. The kernels' side of it
// (fixed blocking of every reduction) is tests/test_ops_threads.cpp.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

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
