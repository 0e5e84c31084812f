// bf16 and fp16 training through the real binary: resume bit for bit after SIGKILL, the fp16
// loss scaler (an overflow is skipped and backs the scale off; too many in a row stop the run
// with exit code 4 and a diagnostic; earlier checkpoints stay valid), gradient underflow with
// and without scaling, and the per-tensor gradient range report.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/checkpoint_files.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::TempDir kScratch("test_train_precision");
const fs::path& kDir = kScratch.path;

const std::string kQuick = test_support::quickstart_recipe();

using test_support::split;
using test_support::wait_exit;

pid_t spawn(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return test_support::spawn_runner(args, env);
}

int run(const std::string& args, const std::vector<std::string>& env = {}) { return wait_exit(spawn(split(args), env)); }

std::string read_file(const fs::path& p) { return test_support::slurp(p); }

std::vector<nlohmann::json> records(const fs::path& run_dir) { return test_support::metrics_records(run_dir); }

// Step records (not eval, rollback or summary), by step.
std::map<int64_t, nlohmann::json> steps_of(const fs::path& run_dir) {
  std::map<int64_t, nlohmann::json> out;
  for (auto& j : records(run_dir))
    if (j.contains("loss") && !j.contains("eval") && !j.contains("rollback") && !j.contains("summary"))
      out[j["step"].get<int64_t>()] = j;
  return out;
}

// Every dataset under /params and /optimizer: raw bytes and the stored HDF5 type's size.
std::map<std::string, std::pair<std::vector<char>, size_t>> tensors(const fs::path& file) {
  return test_support::checkpoint_datasets(file);
}

}  // namespace

TEST_CASE("bf16 and fp16: SIGKILL after the step-20 checkpoint, `runner resume` continues bit for bit") {
  for (const char* prec : {"bf16", "fp16"}) {
    CAPTURE(prec);
    const std::string args = kQuick + " --quiet --set train.steps=30 --set checkpoint.every_steps=10 --set checkpoint.keep_last=10 "
                             "--set train.eval_every=0 --set model.dropout=0.1 --set precision.compute=" + prec;
    const fs::path ref = kDir / (std::string("straight_") + prec), dir = kDir / (std::string("killed_") + prec);
    REQUIRE(run("train " + args + " --run-dir " + ref.string()) == 0);
    pid_t pid = spawn(split("train " + args + " --run-dir " + dir.string()));
    const fs::path latest = dir / "checkpoints" / "LATEST";
    const bool killed = test_support::signal_when(
        pid, SIGKILL, [&] { return fs::exists(latest) && read_file(latest).find("step_00000020") != std::string::npos; }, 300000);
    REQUIRE(killed);
    CHECK(wait_exit(pid) == 128 + SIGKILL);
    REQUIRE(run("resume " + dir.string() + " --quiet") == 0);
    for (auto& [name, t] :
         test_support::check_same_datasets(ref / "checkpoints" / "step_00000030.h5", dir / "checkpoints" / "step_00000030.h5")) {
      CAPTURE(name);
      if (name.rfind("/params/", 0) == 0) CHECK(t.second == 4);  // the fp32 masters are what is stored
    }
    auto sa = steps_of(ref), sb = steps_of(dir);
    REQUIRE(sa.size() == 30);
    REQUIRE(sb.size() == 30);
    for (auto& [step, j] : sa) {
      CAPTURE(step);
      CHECK(sb[step]["loss"].get<double>() == j["loss"].get<double>());
      CHECK(sb[step]["loss_scale"].get<double>() == j["loss_scale"].get<double>());
    }
  }
}

TEST_CASE("fp16: an overflowed step is skipped, backs the scale off and names the tensor; it is not a rollback") {
  const fs::path dir = kDir / "overflow";
  const std::string args = "train " + kQuick + " --quiet --set train.steps=10 --set train.eval_every=0 "
                           "--set checkpoint.snapshot_every=2 --set precision.compute=fp16 "
                           "--set precision.loss_scale.init=1024 --set precision.loss_scale.growth_interval=3 --run-dir " + dir.string();
  REQUIRE(run(args, {"RUNNER_FAULT_INF_STEP=5"}) == 0);
  auto s = steps_of(dir);
  REQUIRE(s.size() == 10);
  // Steps 1-3 clean: the scale grows once (growth_interval 3), to 2048 from step 4.
  CHECK(s[3]["loss_scale"].get<double>() == 1024);
  CHECK(s[4]["loss_scale"].get<double>() == 2048);
  CHECK(s[5]["loss_scale"].get<double>() == 2048);
  CHECK(s[5]["overflow"].get<bool>());
  CHECK(s[5]["skipped"].get<bool>());
  // The injected +inf sits in the last parameter: the report names a parameter the checkpoint holds.
  const std::string named = s[5]["overflow_tensor"].get<std::string>();
  REQUIRE(named.find(" (") != std::string::npos);
  CHECK(tensors(dir / "checkpoints" / "step_00000010.h5").count("/params/" + named.substr(0, named.find(" ("))) == 1);
  CHECK(s[6]["loss_scale"].get<double>() == 1024);  // backed off by 0.5
  CHECK_FALSE(s[6]["skipped"].get<bool>());
  CHECK(std::isfinite(s[5]["loss"].get<double>()));
  for (auto& j : records(dir)) CHECK_FALSE(j.contains("rollback"));
  const std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("step 5: fp16 gradients overflowed at loss scale 2048") != std::string::npos);
  CHECK(log.find("rolling back") == std::string::npos);
}

TEST_CASE("fp16: past max_consecutive_skips the run stops with exit code 4 and a diagnostic; its checkpoints verify") {
  const fs::path dir = kDir / "skips";
  const std::string args = "train " + kQuick + " --quiet --set train.steps=30 --set train.eval_every=0 "
                           "--set checkpoint.every_steps=5 --set checkpoint.keep_last=10 --set precision.compute=fp16 "
                           "--set precision.loss_scale.max_consecutive_skips=3 --run-dir " + dir.string();
  REQUIRE(run(args, {"RUNNER_FAULT_INF_STEP=8", "RUNNER_FAULT_INF_COUNT=100"}) == 4);
  auto s = steps_of(dir);
  REQUIRE(s.rbegin()->first == 11);  // steps 8, 9, 10 skipped; the fourth in a row stops it
  for (int64_t k = 8; k <= 11; ++k) CHECK(s[k]["overflow"].get<bool>());
  const std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("overflowed on 4 consecutive steps") != std::string::npos);
  CHECK(log.find("in backward order: ") != std::string::npos);
  CHECK(log.find("precision.compute: bf16") != std::string::npos);
  CHECK(log.find("lower optimizer.lr") != std::string::npos);
  // The checkpoints before the stop (steps 5 and 10) verify.
  for (const char* f : {"step_00000005.h5", "step_00000010.h5"}) {
    CAPTURE(f);
    REQUIRE(fs::exists(dir / "checkpoints" / f));
    CHECK(run("inspect " + (dir / "checkpoints" / f).string()) == 0);
  }
}

TEST_CASE("fp16 static scale: the exit-4 message says the scale stayed (static never backs off)") {
  const fs::path dir = kDir / "skips_static";
  const std::string args = "train " + kQuick + " --quiet --set train.steps=10 --set train.eval_every=0 "
                           "--set precision.compute=fp16 --set precision.loss_scale.mode=static "
                           "--set precision.loss_scale.init=512 --set precision.loss_scale.max_consecutive_skips=2 "
                           "--run-dir " + dir.string();
  REQUIRE(run(args, {"RUNNER_FAULT_INF_STEP=3", "RUNNER_FAULT_INF_COUNT=100"}) == 4);
  const std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("overflowed on 3 consecutive steps") != std::string::npos);
  CHECK(log.find("the loss scale stayed at 512 (precision.loss_scale.mode static never backs off)") != std::string::npos);
  CHECK(log.find("backed off") == std::string::npos);
  CHECK(log.find("precision.loss_scale.mode: dynamic") != std::string::npos);
  for (auto& [step, j] : steps_of(dir)) CHECK(j["loss_scale"].get<double>() == 512);
}

TEST_CASE("fp16: skipped steps do not advance AdamW's step count (the first update after k skips is PyTorch's t = 1)") {
  // Steps 1-3 overflow (skipped: no update, moments untouched), step 4 is the first update. With
  // zero moments before it, AdamW at t = 1 moves each weight by -lr * m1/(1-b1) / (sqrt(v1/(1-b2)) + eps),
  // m1 = (1-b1) g, v1 = (1-b2) g^2 (weight decay 0), which PyTorch's GradScaler + AdamW applies;
  // counting the skips (t = 4) would move it by 0.56x that (b1 0.9, b2 0.95).
  const fs::path dir = kDir / "skip_count";
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
  REQUIRE(run("train " + kQuick + " --quiet --set train.steps=4 --set train.eval_every=0 --set checkpoint.every_steps=1 "
              "--set checkpoint.keep_last=10 --set precision.compute=fp16 --set optimizer.weight_decay=0 "
              "--set optimizer.beta1=0.9 --set optimizer.beta2=0.95 --set optimizer.eps=1e-8 --run-dir " + dir.string(),
              {"RUNNER_FAULT_INF_STEP=1", "RUNNER_FAULT_INF_COUNT=3"}) == 0);
  auto s = steps_of(dir);
  REQUIRE(s.size() == 4);
  for (int64_t k = 1; k <= 3; ++k) CHECK(s[k]["skipped"].get<bool>());
  CHECK_FALSE(s[4]["skipped"].get<bool>());
  const double lr = s[4]["lr"].get<double>();
  auto before = tensors(dir / "checkpoints" / "step_00000003.h5"), after = tensors(dir / "checkpoints" / "step_00000004.h5");
  auto floats = [](const std::vector<char>& b) {
    std::vector<float> f(b.size() / sizeof(float));
    std::memcpy(f.data(), b.data(), f.size() * sizeof(float));
    return f;
  };
  double worst = 0, moved = 0;
  size_t n = 0;
  for (auto& [name, t] : after) {
    if (name.rfind("/params/", 0) != 0) continue;
    const std::string p = name.substr(8);
    const auto w0 = floats(before[name].first), w1 = floats(t.first);
    const auto m = floats(after["/optimizer/adam_m/" + p].first), v = floats(after["/optimizer/adam_v/" + p].first);
    REQUIRE(w0.size() == w1.size());
    REQUIRE(m.size() == w1.size());
    for (size_t i = 0; i < w1.size(); ++i, ++n) {
      const double want = -lr * (m[i] / (1 - b1)) / (std::sqrt(v[i] / (1 - b2)) + eps);
      worst = std::max(worst, std::fabs((double(w1[i]) - w0[i]) - want));
      moved = std::max(moved, std::fabs(want));
    }
  }
  REQUIRE(n > 1000);
  CHECK(moved > 0.5 * lr);                   // the update is Adam's ~lr per weight, not 0
  CHECK(worst < 0.01 * lr);                  // t = 1: fp32 rounding of the weights only
  // The checkpoint keeps the run's step and skip counts (AdamW's count is their difference).
  const std::string in = test_support::runner_cmd("inspect " + (dir / "checkpoints" / "step_00000004.h5").string()).out;
  CHECK(in.find("step 4,") != std::string::npos);
  CHECK(in.find("skipped 3)") != std::string::npos);
}

namespace {
// Step 1's gradient range of the quickstart model with small initial weights, in fp16 with the
// given loss scaling: (zero elements, elements), over every tensor.
std::pair<double, double> zeros_at_step1(const std::string& name, const std::string& sets) {
  const fs::path dir = kDir / name;
  REQUIRE(run("train " + kQuick + " --quiet --set train.steps=1 --set train.eval_every=0 --set model.init_std=0.0005 "
              "--diagnose-precision --run-dir " + dir.string() + " " + sets) == 0);
  auto s = steps_of(dir);
  REQUIRE(s.count(1));
  REQUIRE(s[1].contains("grad_range"));
  double zeros = 0, n = 0;
  for (auto& t : s[1]["grad_range"]) {
    zeros += t["zero_fraction"].get<double>();
    n += 1;
  }
  return {zeros, n};
}
}  // namespace

TEST_CASE("fp16 gradients of a small-gradient model underflow without loss scaling, and not with it") {
  auto [z32, n32] = zeros_at_step1("u_fp32", "--set precision.compute=fp32");
  auto [znone, nnone] = zeros_at_step1("u_none", "--set precision.compute=fp16 --set precision.loss_scale.mode=none");
  auto [zdyn, ndyn] = zeros_at_step1("u_dyn", "--set precision.compute=fp16 --set precision.loss_scale.init=65536");
  REQUIRE(n32 == nnone);
  REQUIRE(n32 == ndyn);
  MESSAGE("mean fraction of zero gradient elements per tensor: fp32 " << z32 / n32 << ", fp16 unscaled " << znone / nnone
                                                                      << ", fp16 scaled " << zdyn / ndyn);
  CHECK(znone / nnone > z32 / n32 + 0.05);      // unscaled fp16 flushes small gradients to zero
  // Scaled, at least 90% of the elements unscaled fp16 flushed are back (what stays zero is the
  // attention keys' second-order-small gradients of this deliberately tiny initialisation).
  CHECK(zdyn / ndyn - z32 / n32 < 0.1 * (znone / nnone - z32 / n32));
}

TEST_CASE("--diagnose-precision: per-tensor range in metrics.jsonl and the summary, with the scale each tensor allows") {
  const fs::path dir = kDir / "diag";
  REQUIRE(run("train " + kQuick + " --quiet --set train.steps=4 --set train.log_every=2 --set train.eval_every=0 "
              "--set precision.compute=fp16 --set precision.loss_scale.init=1024 --diagnose-precision --run-dir " + dir.string()) == 0);
  auto s = steps_of(dir);
  REQUIRE(s.size() == 4);
  CHECK(s[1].contains("grad_range"));
  CHECK(s[2].contains("grad_range"));
  CHECK_FALSE(s[3].contains("grad_range"));  // only logged steps
  const auto& g = s[2]["grad_range"];
  REQUIRE(g.size() > 5);
  for (auto& t : g) {
    CAPTURE(t.dump());
    const double mx = t["max_abs"].get<double>();
    CHECK(mx > 0);
    // headroom_bits = log2(65504 / (max * scale)) at scale 1024
    CHECK(std::abs(t["headroom_bits"].get<double>() - std::log2(65504.0 / (mx * 1024))) < 1e-6);
    CHECK(std::abs(t["scale_range"][1].get<double>() * mx / 65504.0 - 1) < 1e-6);  // overflow bound
    CHECK(t["scale_range"][0].get<double>() > 0);
    CHECK(t["underflow_fraction"].get<double>() >= 0);
  }
  const std::string log = read_file(dir / "log.rank0.txt");
  CHECK(log.find("gradient range at the last logged step") != std::string::npos);
  CHECK(log.find("gradient range diagnostics on") != std::string::npos);
}
