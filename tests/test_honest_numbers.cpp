// The numbers a run prints say what they are: the peak MFU is against (the recipe's, the
// device table's, or this CPU's sgemm peak measured once per machine and cached, with a way
// around the cache) and where it came from, in the start-up line, the summary and its record;
// and which GEMM path each compute format takes here, with a warning in `runner plan` and at
// start-up when 16-bit compute is slower than fp32 on this machine.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ops/gemm_path.h"
#include "runner/errors.h"
#include "runner/perf/gemm_report.h"
#include "runner/perf/peak.h"
#include "runner/recipe/recipe.h"
#include "tests/support/env.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using runner::FloatFormat;
using runner::HardwareConfig;

namespace {

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("numbers", name); }

// An environment variable for one scope (restored after; the knobs re-read both times).
using EnvGuard = test_support::ScopedEnv;

// The cache file mfu_peak uses for this machine at `threads` under `dir` (XDG_CACHE_HOME).
fs::path only_cache_file(const fs::path& dir) {
  fs::path found;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir / "runner")) {
    found = e.path();
    ++n;
  }
  REQUIRE(n == 1);
  return found;
}

}  // namespace

TEST_CASE("the MFU peak: the recipe's figure, else the device table's, each saying so") {
  HardwareConfig hw;
  hw.device = "h100-80gb";
  runner::MfuPeak p = runner::mfu_peak(hw, FloatFormat::bf16, 2);
  CHECK(p.flops == doctest::Approx(989e12));
  CHECK(p.kind == "device table");
  CHECK(p.source.find("device table") != std::string::npos);
  CHECK(p.source.find("bf16") != std::string::npos);
  CHECK(p.source.find("h100-80gb") != std::string::npos);
  hw.peak_tflops = 0.25;
  p = runner::mfu_peak(hw, FloatFormat::bf16, 2);
  CHECK(p.flops == doctest::Approx(0.25e12));
  CHECK(p.kind == "recipe");
  CHECK(p.source.find("hardware.peak_tflops 0.25") != std::string::npos);
}

TEST_CASE("the CPU's MFU peak: measured once (best of several rounds), cached per CPU model and threads, bypassable") {
  const fs::path cache = temp_dir("cache");
  EnvGuard xdg("XDG_CACHE_HOME", cache.string());
  HardwareConfig hw;  // cpu: neither the recipe nor the table knows its peak
  CHECK(runner::peak_cache_dir() == (cache / "runner").string());

  // First start: measured and written, with the CPU model and the thread count.
  runner::MfuPeak first = runner::mfu_peak(hw, FloatFormat::fp32, 2);
  CHECK(first.kind == "measured");
  CHECK(first.flops > 0);
  CHECK(first.source.find("best of 3 rounds") != std::string::npos);
  const fs::path file = only_cache_file(cache);
  CHECK(first.cache_file == file.string());
  CHECK(first.source.find("cached in " + file.string()) != std::string::npos);
  auto j = nlohmann::json::parse(std::ifstream(file));
  CHECK(j["cpu_model"] == runner::cpu_model());
  CHECK(j["threads"] == 2);
  CHECK(j["flops"].get<double>() == doctest::Approx(first.flops));

  // The cache is what later starts use: a figure planted in it comes back, measured by nobody.
  j["flops"] = 123e9;
  std::ofstream(file) << j.dump();
  const auto t0 = std::chrono::steady_clock::now();
  runner::MfuPeak again = runner::mfu_peak(hw, FloatFormat::fp32, 2);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.2);  // no 3 x 0.4 s rounds
  CHECK(again.kind == "cached");
  CHECK(again.flops == doctest::Approx(123e9));
  CHECK(again.source.find("cached: best of 3 rounds measured ") != std::string::npos);
  CHECK(again.source.find("RUNNER_PEAK_CACHE=refresh") != std::string::npos);

  // Another thread count is another entry (not this one's figure).
  runner::MfuPeak one = runner::mfu_peak(hw, FloatFormat::fp32, 1);
  CHECK(one.kind == "measured");
  const std::string two = file.filename().string();
  REQUIRE(two.ends_with("-2t.json"));
  CHECK(fs::exists(file.parent_path() / (two.substr(0, two.size() - 8) + "-1t.json")));

  {
    // off: measured at this start, the cache neither read nor written.
    EnvGuard off("RUNNER_PEAK_CACHE", "off");
    runner::MfuPeak p = runner::mfu_peak(hw, FloatFormat::fp32, 2);
    CHECK(p.kind == "measured");
    CHECK(p.flops != doctest::Approx(123e9));
    CHECK(p.source.find("not cached (RUNNER_PEAK_CACHE=off)") != std::string::npos);
    CHECK(nlohmann::json::parse(std::ifstream(file))["flops"].get<double>() == doctest::Approx(123e9));
  }
  {
    // refresh: measured now and the cached figure replaced.
    EnvGuard refresh("RUNNER_PEAK_CACHE", "refresh");
    runner::MfuPeak p = runner::mfu_peak(hw, FloatFormat::fp32, 2);
    CHECK(p.kind == "measured");
    CHECK(nlohmann::json::parse(std::ifstream(file))["flops"].get<double>() == doctest::Approx(p.flops));
  }
  {
    EnvGuard bad("RUNNER_PEAK_CACHE", "sometimes");
    CHECK_THROWS_AS(runner::check_peak_cache_env(), runner::UserError);
  }
  // A cache written for another CPU model is not this machine's.
  j = nlohmann::json::parse(std::ifstream(file));
  j["cpu_model"] = "another CPU";
  std::ofstream(file) << j.dump();
  CHECK(runner::mfu_peak(hw, FloatFormat::fp32, 2).kind == "measured");
}

TEST_CASE("a run says which peak its MFU is against: start-up line, summary line and record; above 100% it says why") {
  const fs::path dir = temp_dir("run"), cache = dir / "cache";
  const fs::path recipe = test_support::write_layout_recipe(dir);
  const std::string args = "train " + recipe.string() + " --quiet --set train.steps=4 --set train.eval_every=0";
  // First run: measures and caches.
  test_support::Result r = test_support::sh("XDG_CACHE_HOME=" + cache.string() + " " + test_support::binary() + " " + args +
                                            " --run-dir " + (dir / "a").string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::string log = test_support::slurp(dir / "a" / "log.rank0.txt");
  CHECK(log.find("  MFU        against ") != std::string::npos);
  CHECK(log.find("fp32 sgemm peak of this CPU") != std::string::npos);
  CHECK(log.find("measured now: best of 3 rounds, cached in " + cache.string()) != std::string::npos);
  CHECK(log.find("MFU is against ") != std::string::npos);  // with the summary
  nlohmann::json summary;
  for (const auto& j : test_support::metrics_records(dir / "a"))
    if (j.contains("summary")) summary = j;
  CHECK(summary["peak_kind"] == "measured");
  CHECK(summary["peak_source"].get<std::string>().find("fp32 sgemm peak") != std::string::npos);
  CHECK(summary["mfu"].get<double>() > 0);

  // A cached figure far too low (as one measured on a busy machine would be): the second run
  // takes it without measuring, says so, and warns that MFU above 100% means the peak is wrong.
  const fs::path file = only_cache_file(cache);
  auto j = nlohmann::json::parse(std::ifstream(file));
  j["flops"] = 1e6;
  std::ofstream(file) << j.dump();
  r = test_support::sh("XDG_CACHE_HOME=" + cache.string() + " " + test_support::binary() + " " + args + " --run-dir " +
                       (dir / "b").string());
  REQUIRE(r.code == 0);
  log = test_support::slurp(dir / "b" / "log.rank0.txt");
  CHECK(log.find("  MFU        against 0.0 GFLOP/s: fp32 sgemm peak of this CPU") != std::string::npos);
  CHECK(log.find(", cached: best of 3 rounds measured") != std::string::npos);
  CHECK(log.find("is above 100%: the peak it is against is too low") != std::string::npos);
  CHECK(log.find("RUNNER_PEAK_CACHE=refresh") != std::string::npos);
  // Said at the step line that first shows it, before the summary (which a stopped run never reaches).
  CHECK(log.find("is above 100%") < log.find("done: "));
  for (const auto& rec : test_support::metrics_records(dir / "b"))
    if (rec.contains("summary")) CHECK(rec["peak_kind"] == "cached");
  // A bad cache mode is refused before the run directory is touched.
  r = test_support::sh("RUNNER_PEAK_CACHE=maybe " + test_support::binary() + " " + args + " --run-dir " + (dir / "c").string());
  CHECK(r.code == 2);
  CHECK(r.out.find("RUNNER_PEAK_CACHE=maybe is not a cache mode") != std::string::npos);
  CHECK(!fs::exists(dir / "c"));
}

TEST_CASE("the GEMM report: each format's path, and a warning when 16-bit compute is slower than fp32 here") {
  const ops::GemmPaths saved = ops::gemm_paths();
  // fp32: OpenBLAS's sgemm, nothing measured, nothing to warn of.
  runner::GemmReport g = runner::gemm_report(FloatFormat::fp32);
  REQUIRE(g.lines.size() == 1);
  CHECK(g.lines[0].find("fp32: fp32-sgemm") == 0);
  CHECK(g.warning.empty());

  ops::GemmPaths p = saved;
  p.probe_N = 512, p.probe_C = 768, p.probe_OC = 2304;
  // bf16 widened to sgemm (oneDNN measured slower still): known slower than fp32.
  p.bf16.path = ops::GemmPath::Sgemm;
  p.bf16.onednn_available = true;
  p.bf16.sgemm_gflops = 150, p.bf16.onednn_gflops = 120, p.bf16.fp32_gflops = 280;
  p.bf16.why = "measured";
  ops::set_gemm_paths(p);
  g = runner::gemm_report(FloatFormat::bf16);
  REQUIRE(g.lines.size() == 2);
  CHECK(g.lines[1].find("fp32: fp32-sgemm") == 0);  // what it is compared with
  CHECK(g.lines[0].find("bf16: fp32-sgemm (operands widened to fp32, then OpenBLAS sgemm)") == 0);
  CHECK(g.lines[0].find("oneDNN 120 GFLOP/s, widened to sgemm 150, fp32 compute 280") != std::string::npos);
  CHECK(g.warning.find("bf16 compute is slower than fp32 on this machine") == 0);
  CHECK(g.warning.find("measured 150 against fp32's 280 GFLOP/s") != std::string::npos);
  CHECK(g.warning.find("precision.compute: fp32") != std::string::npos);
  // The probe measured the widened GEMM faster than fp32's (noise): the warning does not quote
  // those figures as "slower".
  p.bf16.sgemm_gflops = 300;
  ops::set_gemm_paths(p);
  g = runner::gemm_report(FloatFormat::bf16);
  CHECK(g.warning.find("measured 300 against fp32's 280") == std::string::npos);
  CHECK(g.warning.find("measured alike, 300 and fp32's 280 GFLOP/s") != std::string::npos);
  p.bf16.sgemm_gflops = 150;

  // bf16 on oneDNN's AMX kernel, faster than fp32: the path and its ISA, no warning.
  p.bf16.path = ops::GemmPath::OneDnn;
  p.bf16.onednn_impl = "brg:avx512_core_amx_bf16";
  p.bf16.onednn_gflops = 900;
  ops::set_gemm_paths(p);
  g = runner::gemm_report(FloatFormat::bf16);
  CHECK(g.lines[0].find("bf16: onednn-bf16 (oneDNN's bf16 matmul, kernel brg:avx512_core_amx_bf16: AMX)") == 0);
  CHECK(g.lines[0].find("this path 900 GFLOP/s") != std::string::npos);
  CHECK(g.warning.empty());
  // ... and on oneDNN's AVX512-BF16 kernel measured below fp32: warned.
  p.bf16.onednn_impl = "brg:avx512_core_bf16";
  p.bf16.onednn_gflops = 200;
  ops::set_gemm_paths(p);
  g = runner::gemm_report(FloatFormat::bf16);
  CHECK(g.lines[0].find("AVX512-BF16") != std::string::npos);
  CHECK(g.warning.find("oneDNN's bf16 GEMMs measured 200 GFLOP/s against fp32's 280") != std::string::npos);

  // fp16 with no oneDNN path: known slower without measuring.
  p.f16.path = ops::GemmPath::Sgemm;
  p.f16.onednn_available = false;
  p.f16.sgemm_gflops = p.f16.onednn_gflops = p.f16.fp32_gflops = 0;
  p.f16.why = "onednn-fp16 unavailable: no fp16 matmul on this CPU";
  ops::set_gemm_paths(p);
  g = runner::gemm_report(FloatFormat::fp16);
  CHECK(g.lines[0].find("fp16: fp32-sgemm (operands widened to fp32, then OpenBLAS sgemm; onednn-fp16 unavailable") == 0);
  CHECK(g.warning.find("fp16 compute is slower than fp32 on this machine: its GEMMs widen the operands") == 0);
  ops::set_gemm_paths(saved);
}

TEST_CASE("runner plan and the start-up banner say which GEMM path each format takes and warn when 16-bit is slower") {
  const std::string qs = test_support::quickstart_recipe();
  test_support::Result r = test_support::runner_cmd("plan " + qs);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("  GEMM       fp32: fp32-sgemm") != std::string::npos);
  CHECK(r.out.find("warning:") == std::string::npos);
  // bf16 kept off oneDNN's path: slower than fp32 whatever the CPU, and plan says so.
  r = test_support::sh("RUNNER_GEMM_PATH=sgemm " + test_support::binary() + " plan " + qs + " --set precision.compute=bf16");
  REQUIRE(r.code == 0);
  CHECK(r.out.find("  GEMM       bf16: fp32-sgemm (operands widened to fp32, then OpenBLAS sgemm; RUNNER_GEMM_PATH=sgemm)") !=
        std::string::npos);
  CHECK(r.out.find("             fp32: fp32-sgemm") != std::string::npos);
  CHECK(r.out.find("  warning: bf16 compute is slower than fp32 on this machine") != std::string::npos);
  // The start-up banner: the same lines, the warning as a warning.
  const fs::path dir = temp_dir("banner");
  r = test_support::sh("RUNNER_GEMM_PATH=sgemm " + test_support::binary() + " train " + qs + " --run-dir " +
                       (dir / "run").string() + " --set precision.compute=bf16 --set train.steps=2 --set train.eval_every=0 "
                       "--set hardware.peak_tflops=0.1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("  GEMM       bf16: fp32-sgemm (operands widened to fp32, then OpenBLAS sgemm; RUNNER_GEMM_PATH=sgemm) "
                   "(recorded in gemm_paths.json)") != std::string::npos);
  CHECK(r.out.find("             fp32: fp32-sgemm") != std::string::npos);
  CHECK(r.out.find("bf16 compute is slower than fp32 on this machine") != std::string::npos);
  CHECK(r.out.find("  MFU        against 100.0 GFLOP/s: hardware.peak_tflops 0.1 TFLOP/s per device, from the recipe") !=
        std::string::npos);
}

TEST_CASE("a job that resumed says which steps it trained in its wall time; status calls the killed job crashed") {
  const fs::path dir = temp_dir("resumed"), run = dir / "run";
  const fs::path recipe = test_support::write_layout_recipe(dir);  // 10 steps, a checkpoint every 5
  const std::string args = "train " + recipe.string() + " --set train.eval_every=0 --set hardware.peak_tflops=0.1 --run-dir " +
                           run.string();
  // The first job dies in step 7 (a crashed kernel, a lost node): no stop record.
  test_support::Result r = test_support::sh("RUNNER_FAULT_FAIL_RANK=0 RUNNER_FAULT_FAIL_STEP=7 " + test_support::binary() +
                                            " " + args + " --quiet");
  REQUIRE(r.code != 0);
  r = test_support::runner_cmd("status " + run.string());
  INFO(r.out);
  CHECK(r.out.find("state       crashed: its owner") != std::string::npos);
  CHECK(r.out.find("continue from step 5 with `runner resume " + run.string() + "`") != std::string::npos);
  CHECK(r.out.find("eta         none (not running)") != std::string::npos);
  // The second job continues from step 5 and trains 6-10: its summary says so.
  r = test_support::runner_cmd(args);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("done: 10 steps (6-10 in this job) in ") != std::string::npos);
  for (const auto& j : test_support::metrics_records(run))
    if (j.contains("summary")) CHECK(j["resumed_from"] == 5);
  r = test_support::runner_cmd("status " + run.string());
  CHECK(r.out.find("state       finished\n") != std::string::npos);
}
