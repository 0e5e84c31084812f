// hardware.device selects the backend: cuda and the GPU kinds the plan knows want the CUDA
// backend, and on a machine without a usable GPU (this one, CI) `runner train` and
// `runner resume` exit 2 at hardware.device, saying no CUDA device was found, before writing
// anything; cpu and custom stay on the CPU backend.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "runner/device/device.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using test_support::Result;

Result run(const std::string& args, const std::string& cwd) { return test_support::runner_cmd(args, cwd); }

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("dev", name); }

const std::string kQuickstart = std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml";

}  // namespace

TEST_CASE("GPU device names want the CUDA backend, cpu and custom do not") {
  for (const char* d : {"cuda", "a100-40gb", "a100-80gb", "h100-80gb", "h200", "v100-32gb", "l40s"}) {
    CAPTURE(d);
    CHECK(runner::wants_gpu(d));
  }
  CHECK_FALSE(runner::wants_gpu("cpu"));
  CHECK_FALSE(runner::wants_gpu("custom"));
}

TEST_CASE("runner train on a GPU recipe without a GPU exits 2 and writes nothing") {
  if (getenv("RUNNER_EXPECT_GPU")) {
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

TEST_CASE("runner resume of a GPU recipe without a GPU exits 2") {
  if (getenv("RUNNER_EXPECT_GPU")) return;
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
