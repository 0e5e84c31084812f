// bf16 and fp16 on every kind of layout, through the real binary under mpirun.
//
// The layout recipe of test_parallel (2 layers, a vocabulary of 63 that tensor parallelism
// pads, dropout 0.1) is trained for 10 steps in fp32 and in bf16 on one rank, then in bf16
// (and fp16) on dp, tp, pp, sequence-parallel and ZeRO-1 layouts, with and without recompute.
//
// Tolerance, from a measured argument: a layout changes only the order of fp32 summations
// (the data-parallel all-reduce, tensor-parallel partial sums, the accumulation over
// micro-batches). In fp32 that moves the losses by ~1e-7 (test_parallel bounds it by 1e-5).
// In 16 bits the same perturbation can move a stored activation across a rounding boundary,
// i.e. by one unit in the last place, after which the difference propagates like any other
// bf16 rounding. The run's total of such roundings is what separates the serial bf16 run from
// the serial fp32 run, so a layout's bf16 run may differ from the serial bf16 run by at most
// that measured bf16-vs-fp32 gap (with 2x slack: both runs round, in different places), and
// never by more than 2% of the loss. The ledger's accounts must still hold within 5%.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::LayoutScratch kScratch("test_parallel_precision");
const fs::path& kDir = kScratch.path();

std::string recipe_path() { return kScratch.recipe(); }

std::map<int64_t, double> losses_of(const fs::path& run) { return test_support::step_losses(run, /*skip_summary=*/true); }

std::map<int64_t, double> train(const std::string& name, int np, const std::string& sets) {
  fs::remove_all(kDir / name);
  std::string cmd = test_support::launcher(np) + RUNNER_BINARY + " train " + recipe_path() + " --quiet --run-dir " +
                    (kDir / name).string() + " " + sets;
  test_support::Result r = test_support::sh(cmd);
  INFO(cmd << "\n" << r.out);
  REQUIRE(r.code == 0);
  return losses_of(kDir / name);
}

double max_rel(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  double worst = 0;
  REQUIRE(a.size() == b.size());
  for (auto& [step, la] : a) {
    auto it = b.find(step);
    REQUIRE(it != b.end());
    worst = std::max(worst, std::abs(la - it->second) / std::abs(la));
  }
  return worst;
}

// Rank 0's measured peak of each account against the plan's prediction for its stage.
void check_ledger(const fs::path& run) { test_support::check_ledger(run); }

// `--set hardware.memory_gb=...` halfway between what recompute full and none need on the
// worst stage of the layout `sets` gives (so that recompute auto must choose some, not all).
std::string device_between_full_and_none(const std::vector<std::string>& sets) {
  auto total = [&](const char* mode) {
    std::vector<std::string> s = sets;
    s.push_back(std::string("recompute.mode=") + mode);
    s.push_back("hardware.memory_gb=1000");
    s.push_back("parallel.dp=1");  // as mpirun -np 2 derives it
    return runner::make_plan(runner::load_recipe(recipe_path(), s), 0).worst_stage().total();
  };
  const double mid = 0.5 * (total("none") + total("full"));
  return fmt::format("--set hardware.memory_gb={:.12f}", mid / double(1ull << 30));
}

}  // namespace

TEST_CASE("bf16 and fp16 train on every kind of layout within the measured 16-bit tolerance, and the ledger holds") {
  const auto fp32 = train("serial_fp32", 0, "");
  const auto bf16 = train("serial_bf16", 0, "--set precision.compute=bf16");
  const auto fp16 = train("serial_fp16", 0, "--set precision.compute=fp16 --set precision.loss_scale.init=1024");
  REQUIRE(fp32.size() == 10);
  const double gap16 = std::max(max_rel(fp32, bf16), max_rel(fp32, fp16));
  MESSAGE("serial 16-bit vs fp32, largest relative loss difference: bf16 " << max_rel(fp32, bf16) << ", fp16 "
                                                                          << max_rel(fp32, fp16));
  CHECK(gap16 > 0);       // the 16-bit runs really round
  CHECK(gap16 < 0.02);    // and track fp32
  check_ledger(kDir / "serial_bf16");
  check_ledger(kDir / "serial_fp16");
  const double tol = std::min(0.02, 2 * gap16);
  struct Layout {
    const char* name;
    int np;
    const char* sets;
    bool fp16;
  };
  const Layout layouts[] = {
      {"dp2", 2, "--set parallel.dp=2", false},
      {"tp2", 2, "--set parallel.tp=2", false},
      {"pp2", 2, "--set parallel.pp=2", false},
      {"tp2pp2", 4, "--set parallel.tp=2 --set parallel.pp=2", false},
      {"dp2zero1", 2, "--set parallel.zero=1", false},
      {"tp2sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true", false},
      {"pp2_full", 2, "--set parallel.pp=2 --set recompute.mode=full", false},
      {"tp2_selective", 2, "--set parallel.tp=2 --set recompute.mode=selective --set recompute.modules=[attention_core]", false},
      {"dp2zero1_fp16", 2, "--set parallel.zero=1", true},
      {"pp2_fp16", 2, "--set parallel.pp=2", true},
  };
  const std::string auto_bf16 = "--set parallel.pp=2 --set recompute.mode=auto " +
                                device_between_full_and_none({"parallel.pp=2", "precision.compute=bf16"});
  const std::string auto_fp16 = "--set parallel.tp=2 --set recompute.mode=auto " +
                                device_between_full_and_none({"parallel.tp=2", "precision.compute=fp16"});
  std::vector<Layout> all(std::begin(layouts), std::end(layouts));
  all.push_back({"pp2_auto", 2, auto_bf16.c_str(), false});
  all.push_back({"tp2_auto_fp16", 2, auto_fp16.c_str(), true});
  for (const Layout& l : all) {
    CAPTURE(l.name);
    const std::string prec = l.fp16 ? " --set precision.compute=fp16 --set precision.loss_scale.init=1024"
                                    : " --set precision.compute=bf16";
    auto losses = train(l.name, l.np, std::string(l.sets) + prec);
    const double d = max_rel(l.fp16 ? fp16 : bf16, losses);
    MESSAGE(std::string(l.name) << ": largest relative loss difference from the serial 16-bit run " << d << " (tolerance " << tol << ")");
    CHECK(d <= tol);
    check_ledger(kDir / l.name);
    if (std::string(l.name).find("auto") != std::string::npos) {  // auto chose something, and not everything
      auto plan = nlohmann::json::parse(std::ifstream(kDir / l.name / "plan.json"));
      REQUIRE(plan.contains("recompute"));
      INFO(plan["recompute"].dump());
      CHECK(plan["recompute"].dump().find("attention_core") != std::string::npos);
    }
  }
}
