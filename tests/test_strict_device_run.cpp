// The strict device proves the data movement: the same recipe trained on `cpu` and on
// `cpu-strict` (tensor memory host code cannot touch, kernels queued asynchronously, copies out
// poisoned until waited for) gives the same loss at every step, bit for bit, and the same
// checkpoint datasets, in fp32 and in bf16 with fp32 masters. The strict runs are killed with
// SIGKILL after their step-10 checkpoint (written asynchronously: staged out of the device on its
// queue while training goes on) and resumed (copied back in), so saving, the asynchronous
// staging, loading and the continuation are all inside the comparison.
//
// Through the real binary, as tests/test_resume.cpp does; the plain run is forced to `cpu` even
// under RUNNER_STRICT=1 (this test compares the two devices itself).
#include <doctest/doctest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/checkpoint_files.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;

namespace {

std::string args(const std::string& precision, const std::string& device, bool async) {
  return std::string(RUNNER_SOURCE_DIR) +
         "/recipes/quickstart.yaml --quiet --set train.steps=20 --set checkpoint.every_steps=10 "
         "--set checkpoint.keep_last=10 --set train.eval_every=0 --set model.dropout=0.1 --set precision.compute=" +
         precision + " --set hardware.device=" + device + " --set checkpoint.async=" + (async ? "true" : "false");
}

void require_same_checkpoint(const fs::path& a, const fs::path& b, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld.h5", static_cast<long long>(step));
  const fs::path fa = a / "checkpoints" / name, fb = b / "checkpoints" / name;
  REQUIRE(fs::exists(fa));
  REQUIRE(fs::exists(fb));
  auto ta = test_support::checkpoint_datasets(fa), tb = test_support::checkpoint_datasets(fb);
  REQUIRE(ta.size() == tb.size());
  REQUIRE(ta.size() > 10);
  for (auto& [ds, data] : ta) {
    CAPTURE(ds);
    REQUIRE(tb.count(ds));
    CHECK(data.first == tb[ds].first);  // every byte
  }
}

}  // namespace

TEST_CASE("cpu and cpu-strict train bit for bit alike, through an async checkpoint, a SIGKILL and a resume") {
  unsetenv("RUNNER_STRICT");  // the plain run must stay on `cpu`
  using test_support::split;
  using test_support::wait_exit;
  for (const std::string precision : {"fp32", "bf16"}) {
    CAPTURE(precision);
    const fs::path cpu = test_support::fresh_dir("strict_run", "cpu_" + precision);
    const fs::path strict = test_support::fresh_dir("strict_run", "strict_" + precision);
    REQUIRE(wait_exit(test_support::spawn_runner(split("train " + args(precision, "cpu", false) + " --run-dir " + cpu.string()))) == 0);

    // Strict: killed once the step-10 checkpoint is published, then resumed.
    pid_t pid = test_support::spawn_runner(split("train " + args(precision, "cpu-strict", true) + " --run-dir " + strict.string()));
    const fs::path latest = strict / "checkpoints" / "LATEST";
    const bool killed = test_support::signal_when(
        pid, SIGKILL, [&] { return fs::exists(latest) && test_support::slurp(latest).find("step_00000010") != std::string::npos; },
        400000);
    REQUIRE(killed);
    CHECK(wait_exit(pid) == 128 + SIGKILL);
    CHECK_FALSE(fs::exists(strict / "checkpoints" / "step_00000020.h5"));
    REQUIRE(wait_exit(test_support::spawn_runner(split("resume " + strict.string() + " --quiet"))) == 0);

    const auto lc = test_support::step_losses(cpu), ls = test_support::step_losses(strict);
    REQUIRE(lc.size() == 20);
    REQUIRE(ls.size() == 20);
    for (auto& [step, loss] : lc) {
      CAPTURE(step);
      CHECK(ls.at(step) == loss);  // exact
    }
    require_same_checkpoint(cpu, strict, 10);
    require_same_checkpoint(cpu, strict, 20);
  }
}
