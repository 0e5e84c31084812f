// Every kind of layout on the strict device equals its run on the CPU, bit for bit (issue 26).
//
// The layout recipe (tests/support/recipes.h: a 2-layer GPT with dropout, a vocabulary tensor
// parallelism must pad) is trained for a few steps under mpirun on `cpu` and on `cpu-strict`
// in dp2, tp2 (with sequence parallelism), pp2 (1F1B), ZeRO-1 over dp2 with small buckets (so
// several are in flight at once) and pp2 GPipe. On the strict device every gradient bucket,
// tensor-parallel collective and pipeline message takes device memory that host code cannot
// touch, so they go through the communicators' host-staged path (parallel/tensor_comm.cpp):
// the per-step losses and the held-out losses must be identical, not merely close.
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::TempDir kScratch("test_strict_layouts");
const fs::path& kDir = kScratch.path;

std::string recipe_path() {
  static const fs::path p = test_support::write_layout_recipe(kDir);
  return p.string();
}

// Few steps, a held-out evaluation in the middle and at the end; checkpoints are another
// room's test (tests/test_strict_device_run.cpp).
const char* kShort = " --set train.steps=4 --set train.eval_every=2 --set checkpoint.every_steps=1000";

// Trains kDir/name on `device` (the cpu run without RUNNER_STRICT, which would make it strict).
void train(const std::string& name, int np, const std::string& device, const std::string& sets) {
  fs::remove_all(kDir / name);
  const std::string cmd = "env -u RUNNER_STRICT " + test_support::launcher(np) + RUNNER_BINARY + " train " +
                          recipe_path() + " --quiet --run-dir " + (kDir / name).string() + kShort +
                          " --set hardware.device=" + device + " " + sets;
  test_support::Result r = test_support::sh(cmd);
  INFO(cmd << "\n" << r.out);
  REQUIRE(r.code == 0);
}

// Every loss record (training steps and held-out evaluations), by step and kind.
std::map<std::string, double> losses(const fs::path& run) {
  std::map<std::string, double> out;
  for (const nlohmann::json& j : test_support::metrics_records(run)) {
    if (!j.contains("step") || j.contains("summary")) continue;
    const std::string step = std::to_string(j["step"].get<int64_t>());
    if (j.contains("eval") && j.contains("val_loss")) out["eval " + step] = j["val_loss"].get<double>();
    else if (j.contains("loss")) out["train " + step] = j["loss"].get<double>();
  }
  return out;
}

}  // namespace

TEST_CASE("dp, tp, pp and ZeRO on cpu-strict give the cpu run's losses bit for bit") {
  struct Layout {
    const char* name;
    int np;
    const char* sets;
  };
  const Layout layouts[] = {
      {"dp2", 2, "--set parallel.dp=2"},
      {"tp2sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"pp2", 2, "--set parallel.pp=2 --set parallel.schedule=1f1b"},
      {"dp2zero1", 2, "--set parallel.zero=1 --set parallel.bucket_mb=0.01"},
      {"pp2gpipe", 2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
  };
  for (const Layout& l : layouts) {
    CAPTURE(l.name);
    train(std::string(l.name) + "_cpu", l.np, "cpu", l.sets);
    train(std::string(l.name) + "_strict", l.np, "cpu-strict", l.sets);
    const auto cpu = losses(kDir / (std::string(l.name) + "_cpu"));
    const auto strict = losses(kDir / (std::string(l.name) + "_strict"));
    CHECK(cpu.count("train 4") == 1);
    CHECK(cpu.count("eval 4") == 1);
    CHECK(strict.size() == cpu.size());
    for (const auto& [key, v] : cpu) {
      CAPTURE(key);
      auto it = strict.find(key);
      REQUIRE(it != strict.end());
      CHECK(it->second == v);  // identical doubles, not close ones
    }
  }
}
