// The single-rank training step on the strict device (docs/invariants.md invariant 7):
// the quickstart trained a few steps on `cpu` and on `cpu-strict` gives bit-identical step
// records (loss, gradient norm, loss scale, measured peak memory) and evaluation, in fp32, bf16
// and fp16 (with an overflowed step skipped). On the strict device any host access to a
// tensor's storage faults, and a value read out before the device finished is poison, so
// equal records mean the step ran on the device and crossed only at its named points: the
// batch in, the loss, norm and overflow out, the logits out for the accuracy.
//
// The run is stopped by the fault hook before its final checkpoint (RUNNER_FAULT_FAIL_STEP):
// this test is about the step path; checkpoints on the strict device have their own tests.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

using namespace test_support;

namespace {

constexpr int kSteps = 4;

// The quickstart at a smaller batch, kSteps steps, an evaluation after step 2, on `device`;
// stopped at the start of step kSteps + 1. `env`: extra NAME=value assignments.
std::vector<nlohmann::json> train(const fs::path& dir, const std::string& device, const std::string& precision,
                                  const std::string& env) {
  const fs::path run = dir / (device + "-" + precision);
  const std::string sets = "--set hardware.device=" + device + " --set precision.compute=" + precision +
                           " --set batch.micro=8 --set train.steps=" + std::to_string(kSteps + 2) +
                           " --set train.eval_every=2 --set train.eval_batches=2 --set train.threads=2"
                           " --set checkpoint.every_steps=1000";
  Result r = sh("cd " + dir.string() + " && RUNNER_STRICT= RUNNER_FAULT_FAIL_RANK=0 RUNNER_FAULT_FAIL_STEP=" + std::to_string(kSteps + 1) +
                " " + env + " timeout 300 " + binary() + " train " + quickstart_recipe() + " " + sets +
                " --run-dir " + run.string() + " 2>&1");
  INFO(r.out);
  CHECK(r.out.find("injected fault at step " + std::to_string(kSteps + 1)) != std::string::npos);
  CHECK(r.out.find("strict device:") == std::string::npos);
  return metrics_records(run);
}

// What must agree bit for bit: JSON numbers are written round-trip exact, so equal text means
// equal doubles. Timings are left out.
std::vector<std::string> numbers(const std::vector<nlohmann::json>& records) {
  std::vector<std::string> out;
  for (const nlohmann::json& j : records) {
    nlohmann::json k;
    for (const char* key : {"step", "loss", "grad_norm", "loss_scale", "lr", "skipped", "overflow", "overflow_tensor",
                            "peak_bytes", "tokens", "eval", "val_loss", "accuracy"})
      if (j.contains(key)) k[key] = j[key];
    out.push_back(k.dump());
  }
  return out;
}

void check_same(const std::string& precision, const std::string& env = "") {
  TempDir dir("strict_step_" + precision);
  auto cpu = numbers(train(dir, "cpu", precision, env));
  auto strict = numbers(train(dir, "cpu-strict", precision, env));
  REQUIRE(cpu.size() == kSteps + 2);  // kSteps steps and the evaluations after steps 2 and 4
  REQUIRE(strict.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) CHECK(strict[i] == cpu[i]);
}

}  // namespace

TEST_CASE("fp32: a strict-device run's steps are bit-identical to the CPU's") { check_same("fp32"); }

TEST_CASE("bf16: a strict-device run's steps are bit-identical to the CPU's") { check_same("bf16"); }

TEST_CASE("fp16 with an overflowed step: skipped on both, the same numbers, the same tensor named") {
  check_same("fp16", "RUNNER_FAULT_INF_STEP=2");
}
