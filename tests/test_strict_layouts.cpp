// Every kind of layout on the strict device equals its run on the CPU, bit for bit.
//
// The layout recipe (tests/support/recipes.h: a 2-layer GPT with dropout, a vocabulary tensor
// parallelism must pad) is trained for a few steps under mpirun on `cpu` and on `cpu-strict`
// in dp2, tp2 (with sequence parallelism), pp2 (1F1B), ZeRO-1 over dp2 with small buckets (so
// several are in flight at once), pp2 GPipe, and ZeRO-1 in bf16. On the strict device every
// gradient bucket, tensor-parallel collective and pipeline message takes device memory that
// host code cannot touch, so they go through the communicators' host-staged path
// (parallel/tensor_comm.cpp): the step records (loss, gradient norm, learning rate, peak
// memory) and the held-out losses must be identical, not merely close.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::LayoutScratch kScratch("test_strict_layouts");
const fs::path& kDir = kScratch.path();

std::string recipe_path() { return kScratch.recipe(); }

// Four steps with held-out evaluations after steps 2 and 4, stopped by the fault hook at the
// start of step 5, before the final checkpoint: checkpoints on the strict device are another
// room's test (tests/test_strict_device_run.cpp).
const char* kShort = " --set train.steps=6 --set train.eval_every=2 --set checkpoint.every_steps=1000";

// Trains kDir/name on `device` (the cpu run without RUNNER_STRICT, which would make it strict).
void train(const std::string& name, int np, const std::string& device, const std::string& sets) {
  fs::remove_all(kDir / name);
  const std::string cmd = "env -u RUNNER_STRICT RUNNER_FAULT_FAIL_RANK=0 RUNNER_FAULT_FAIL_STEP=5 " +
                          test_support::launcher(np) + RUNNER_BINARY + " train " + recipe_path() + " --quiet --run-dir " +
                          (kDir / name).string() + kShort + " --set hardware.device=" + device + " " + sets + " 2>&1";
  test_support::Result r = test_support::sh(cmd);
  INFO(cmd << "\n" << r.out);
  CHECK(r.out.find("injected fault at step 5") != std::string::npos);
  CHECK(r.out.find("strict device:") == std::string::npos);
}

// The numbers that must agree bit for bit, per record (JSON numbers are written round-trip
// exact, so equal text is equal doubles); timings are left out.
std::vector<std::string> numbers(const fs::path& run) {
  std::vector<std::string> out;
  for (const nlohmann::json& j : test_support::metrics_records(run)) {
    nlohmann::json k;
    for (const char* key : {"step", "loss", "grad_norm", "lr", "peak_bytes", "tokens", "eval", "val_loss", "accuracy"})
      if (j.contains(key)) k[key] = j[key];
    if (j.contains("step")) out.push_back(k.dump());
  }
  return out;
}

}  // namespace

TEST_CASE("dp, tp, pp and ZeRO on cpu-strict give the cpu run's losses bit for bit") {
  const test_support::Layout layouts[] = {
      {"dp2", 2, "--set parallel.dp=2"},
      {"tp2sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"pp2", 2, "--set parallel.pp=2 --set parallel.schedule=1f1b"},
      {"dp2zero1", 2, "--set parallel.zero=1 --set parallel.bucket_mb=0.01"},
      {"pp2gpipe", 2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
      // 16-bit buckets through the staging buffers, summed by MPI's bf16 operation.
      {"dp2zero1_bf16", 2, "--set parallel.zero=1 --set parallel.bucket_mb=0.01 --set precision.compute=bf16"},
  };
  for (const test_support::Layout& l : layouts) {
    const std::string layout = l.name;
    CAPTURE(layout);
    train(std::string(l.name) + "_cpu", l.np, "cpu", l.sets);
    train(std::string(l.name) + "_strict", l.np, "cpu-strict", l.sets);
    const auto cpu = numbers(kDir / (std::string(l.name) + "_cpu"));
    const auto strict = numbers(kDir / (std::string(l.name) + "_strict"));
    CHECK(cpu.size() >= 6);  // 4 steps, 2 evaluations
    CHECK(strict == cpu);
  }
}
