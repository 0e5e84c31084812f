// The device table (runner/device/devices.h) and the schema's hardware.device enum name the
// same kinds; the plan takes memory and peak from the table. hardware.device selects the
// backend: cuda and the GPU kinds want the CUDA backend, and on a machine without a usable GPU
// (this one, CI) `runner train` and `runner resume` exit 2 at hardware.device, saying no CUDA
// device was found, before writing anything; with one (RUNNER_EXPECT_GPU) they train on it; cpu
// and custom stay on the CPU backend.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <set>

#include <nlohmann/json.hpp>

#include "ops/knobs.h"
#include "runner/device/device.h"
#include "runner/device/devices.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;

namespace {

using test_support::Result;

Result run(const std::string& args, const std::string& cwd) { return test_support::runner_cmd(args, cwd); }

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("dev", name); }

const std::string kQuickstart = std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml";

}  // namespace

TEST_CASE("the device table and the schema's hardware.device enum name the same kinds, both ways") {
  std::ifstream f(std::string(RUNNER_SOURCE_DIR) + "/schemas/recipe.schema.json");
  REQUIRE(f);
  const nlohmann::json schema = nlohmann::json::parse(f);
  const nlohmann::json& device = schema["properties"]["hardware"]["properties"]["device"];
  std::set<std::string> in_schema, in_table;
  for (const nlohmann::json& w : device["enum"]) in_schema.insert(w.get<std::string>());
  for (const runner::DeviceKind& d : runner::device_kinds()) in_table.insert(std::string(d.name));
  REQUIRE(in_schema.size() == device["enum"].size());  // no word twice
  REQUIRE(in_table.size() == runner::device_kinds().size());
  for (const std::string& w : in_schema) {
    CAPTURE(w);
    CHECK_MESSAGE(in_table.count(w), "the schema admits a device the table does not know: add it to runner/device/devices.cpp");
  }
  for (const std::string& k : in_table) {
    CAPTURE(k);
    CHECK_MESSAGE(in_schema.count(k), "the table has a device the schema rejects: add it to schemas/recipe.schema.json");
  }
  CHECK(device["default"] == "cpu");
}

TEST_CASE("the device table: the host kinds are cpu and its strict twin; every named GPU has its memory and a peak for each format") {
  int hosts = 0;
  for (const runner::DeviceKind& d : runner::device_kinds()) {
    CAPTURE(d.name);
    CHECK_FALSE((d.host && d.gpu));
    hosts += d.host;
    if (d.gpu && d.name != "cuda") {
      CHECK(d.memory_gb > 0);
      CHECK(d.peak_tflops_fp32 > 0);
      CHECK(d.peak_tflops_bf16 >= d.peak_tflops_fp32);
      CHECK(d.peak_tflops_fp16 >= d.peak_tflops_fp32);
    }
  }
  CHECK(hosts == 2);
  REQUIRE(runner::find_device_kind("cpu"));
  CHECK(runner::find_device_kind("cpu")->host);
  REQUIRE(runner::find_device_kind("cpu-strict"));  // the checking device: the host's memory and peak
  CHECK(runner::find_device_kind("cpu-strict")->host);
  CHECK_FALSE(runner::find_device_kind("tpu"));
}

TEST_CASE("the plan takes device memory and the MFU peak from the table unless the recipe gives them") {
  auto plan = [](std::vector<std::string> sets) { return runner::make_plan(runner::load_recipe(kQuickstart, sets)); };
  const double GiB = double(1ull << 30);
  // v100-32gb and l40s: the schema rejected them while the plan's memory table knew them.
  runner::Plan v = plan({"hardware.device=v100-32gb"});
  CHECK(v.device_memory == 32 * GiB);
  CHECK(v.peak_flops == doctest::Approx(15.7e12));
  runner::Plan l = plan({"hardware.device=l40s", "precision.compute=bf16"});
  CHECK(l.device_memory == 48 * GiB);
  CHECK(l.peak_flops == doctest::Approx(362e12));
  CHECK(plan({"hardware.device=h100-80gb", "precision.compute=bf16"}).peak_flops == doctest::Approx(989e12));
  CHECK(plan({"hardware.device=h200"}).device_memory == 141 * GiB);
  // The recipe's figures win; the CPU's peak is measured at start (0 here).
  runner::Plan given = plan({"hardware.device=h100-80gb", "hardware.peak_tflops=500", "hardware.memory_gb=60"});
  CHECK(given.peak_flops == doctest::Approx(500e12));
  CHECK(given.device_memory == 60 * GiB);
  CHECK(plan({}).peak_flops == 0);
  CHECK(plan({"hardware.device=custom", "hardware.memory_gb=8"}).peak_flops == 0);
}

// select_backend takes the CUDA backend exactly for the device table's kinds marked gpu.
TEST_CASE("GPU device names want the CUDA backend, cpu and custom do not") {
  auto kind = [](const char* d) {
    const runner::DeviceKind* k = runner::find_device_kind(d);
    REQUIRE(k != nullptr);
    return *k;
  };
  for (const char* d : {"cuda", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "v100-32gb", "l40s"}) {
    CAPTURE(d);
    CHECK(kind(d).gpu);
  }
  CHECK_FALSE(kind("cpu").gpu);
  CHECK_FALSE(kind("custom").gpu);
  for (const runner::DeviceKind& d : runner::device_kinds()) CHECK(runner::find_device_kind(d.name) == &d);
}

TEST_CASE("runner train on a GPU recipe without a GPU exits 2 and writes nothing") {
  if (ops::knobs().expect_gpu) {
    MESSAGE("RUNNER_EXPECT_GPU is set: this machine has a GPU, the no-GPU path is not checked here");
    return;
  }
  for (const char* d : {"cuda", "h100-80gb", "h200"}) {
    CAPTURE(d);
    fs::path cwd = temp_dir(d);
    Result r = run("train " + kQuickstart + " --set hardware.device=" + d + " --set train.steps=2 --run-dir run",
                   cwd.string());
    CAPTURE(r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find("hardware.device") != std::string::npos);
    CHECK(r.out.find("no CUDA device was found") != std::string::npos);
    CHECK(r.out.find("hardware.device=cpu") != std::string::npos);  // the fix
    CHECK(r.out.find("terminate called") == std::string::npos);
    CHECK(fs::is_empty(cwd));
    fs::remove_all(cwd);
  }
}

// With a GPU (scripts/gpu-check.sh sets RUNNER_EXPECT_GPU): the GPU kinds train there, on
// device memory, with cuBLASLt's GEMM paths; the old refusal is gone.
TEST_CASE("runner train on a GPU recipe with a GPU trains on it") {
  if (!ops::knobs().expect_gpu) {
    MESSAGE("no GPU here (RUNNER_EXPECT_GPU unset): the GPU path is checked by scripts/gpu-check.sh");
    return;
  }
  fs::path cwd = temp_dir("gpu");
  Result r = run("train " + kQuickstart + " --set hardware.device=cuda --set train.steps=3 --set train.eval_every=0 "
                 "--set precision.compute=bf16 --run-dir run", cwd.string());
  CAPTURE(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("does not run on the GPU") == std::string::npos);
  CHECK(r.out.find("cublaslt-bf16") != std::string::npos);  // the start-up banner's GEMM line
  fs::remove_all(cwd);
}

TEST_CASE("runner resume of a GPU recipe without a GPU exits 2") {
  if (ops::knobs().expect_gpu) return;
  fs::path cwd = temp_dir("resume");
  Result t = run("train " + kQuickstart + " --quiet --set train.steps=2 --set train.eval_every=0 --set checkpoint.every_steps=2 --run-dir run",
                 cwd.string());
  REQUIRE(t.code == 0);
  Result r = run("resume run --set hardware.device=cuda", cwd.string());
  CAPTURE(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("no CUDA device was found") != std::string::npos);
  fs::remove_all(cwd);
}
