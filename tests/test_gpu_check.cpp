// scripts/gpu-check.sh's checks, dry, on CPU-produced metrics (the GPU runs them on its own):
// scripts/compare_metrics.py compares two runs' losses exactly or within a tolerance, reads the
// held-out accuracy and the throughput, and exits 0 / 1 / 2 (holds / does not / cannot tell),
// which the script turns into its phases. The script itself must parse (bash -n) and name every
// phase of the proof.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;

namespace {

const std::string kSrc = RUNNER_SOURCE_DIR;
const std::string kCompare = "python3 " + kSrc + "/scripts/compare_metrics.py ";

test_support::Result train(const fs::path& cwd, const std::string& dir, const std::string& sets) {
  return test_support::runner_cmd("train " + kSrc + "/recipes/quickstart.yaml --quiet --set train.steps=3 "
                                  "--set train.log_every=1 --set train.eval_every=3 --set checkpoint.every_steps=3 " +
                                      sets + " --run-dir " + dir,
                                  cwd.string());
}

}  // namespace

TEST_CASE("compare_metrics.py on CPU runs: exact, within tolerance, accuracy, throughput, and what it cannot tell") {
  const fs::path cwd = test_support::fresh_dir("gpucheck", "metrics");
  REQUIRE(train(cwd, "a", "").code == 0);
  REQUIRE(train(cwd, "b", "").code == 0);                                // the same run again: bit for bit on the CPU
  REQUIRE(train(cwd, "h", "--set precision.compute=bf16").code == 0);  // another precision
  const std::string a = (cwd / "a/metrics.jsonl").string(), b = (cwd / "b/metrics.jsonl").string(),
                    h = (cwd / "h/metrics.jsonl").string();
  auto cmp = [](const std::string& args) { return test_support::sh(kCompare + args); };

  test_support::Result r = cmp("losses " + b + " " + a + " --steps 3 --exact");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"ok\": true") != std::string::npos);
  r = cmp("losses " + h + " " + a + " --steps 3 --exact");
  CHECK(r.code == 1);  // bf16 is not fp32 bit for bit
  CHECK(r.out.find("\"first_bad\"") != std::string::npos);
  r = cmp("losses " + h + " " + a + " --steps 3 --rtol 5e-2 --atol 1e-4");
  CAPTURE(r.out);
  CHECK(r.code == 0);  // but within the script's bf16 tolerance
  r = cmp("losses " + h + " " + a + " --steps 3 --rtol 1e-9 --atol 0");
  CHECK(r.code == 1);
  r = cmp("losses " + a + " " + b + " --steps 50 --exact");
  CHECK(r.code == 2);  // 3 steps cannot prove 50
  CHECK(r.out.find("no loss for steps") != std::string::npos);
  r = cmp("losses " + a + " " + b + " --from 1 --steps 2 --exact");
  CHECK(r.code == 0);  // a resumed tail: steps 2..3

  r = cmp("accuracy " + a + " --min 0.9");
  CHECK(r.code == 1);  // 3 steps learn no addition
  CHECK(r.out.find("\"accuracy\"") != std::string::npos);
  r = cmp("accuracy " + a + " --min 0");
  CHECK(r.code == 0);

  r = cmp("throughput " + a + " --skip 1 --flops-per-token 1e6 --peak-tflops 1");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("\"tokens_per_s\"") != std::string::npos);
  CHECK(r.out.find("\"mfu\"") != std::string::npos);
  CHECK(cmp("throughput " + (cwd / "missing.jsonl").string()).code == 2);
  fs::remove_all(cwd);
}

TEST_CASE("scripts/gpu-check.sh parses and names every phase of the proof") {
  const std::string script = kSrc + "/scripts/gpu-check.sh";
  const test_support::Result r = test_support::sh("bash -n " + script);
  CAPTURE(r.out);
  CHECK(r.code == 0);
  std::ifstream f(script);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* phase : {"test_cuda_kernels", "test_device_select", "quickstart_gpu_", "first50_vs_cpu", "_accuracy",
                            "bench_runner", "resume_gpu_bit_exact", "_host_staged_vs_one_rank", "RUNNER_HOST_STAGED_COMM=1",
                            "RUNNER_GPU_CHECK_CONFIGURE_ONLY", "summary.json", "--compile", "calibrate_gpu",
                            "calibrate --device cuda --out \"$OUT/gpu-profile.json\""}) {
    CAPTURE(phase);
    CHECK(text.find(phase) != std::string::npos);
  }
}
