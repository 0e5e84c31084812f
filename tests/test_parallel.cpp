// Training across ranks, through the real binary under mpirun (docs/invariants.md, invariant 2).
//
// A small GPT (2 layers, 4 heads, a vocabulary of 63 that tensor parallelism must pad,
// dropout 0.1 so that masks must not depend on the layout) is trained for 10 steps with the
// same global batch on one rank and on every (dp, tp, pp) layout of up to 8 ranks, plus
// ZeRO-1 and GPipe variants. Per-step losses must match the single-rank run within 1e-5
// relative and the final parameters (read back from the final checkpoints, which hold
// logical tensors) within 1e-5. Then: bitwise resume on the same layout, resume across
// layouts in both directions, refusal of a world-size mismatch and of an indivisible layout
// with exit code 2 before anything is written, and a failing rank stopping the whole job.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/checkpoint/checkpoint.h"
#include "runner/model/gpt.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::LayoutScratch kScratch("test_parallel");
const fs::path& kDir = kScratch.path();

using test_support::mpirun;
using test_support::Result;
using test_support::sh;



std::string recipe_path() { return kScratch.recipe(); }


std::vector<nlohmann::json> records(const fs::path& run) { return test_support::metrics_records(run); }

// The last record that has `key` (null when none does).
nlohmann::json last_with(const fs::path& run, const char* key) {
  nlohmann::json found;
  for (auto& j : records(run))
    if (j.contains(key)) found = j;
  return found;
}

// Per-step training losses of a run.
std::map<int64_t, double> losses_of(const fs::path& run) { return test_support::step_losses(run); }

// Runs `runner COMMAND TARGET --quiet SETS` (np 0: plain process, no mpirun); requires success.
void run_runner(int np, const std::string& command, const std::string& target, const std::string& sets) {
  std::string cmd = test_support::launcher(np) + RUNNER_BINARY + " " + command + " " + target +
                    " --quiet " + sets;
  Result r = sh(cmd);
  INFO(cmd << "\n" << r.out);
  REQUIRE(r.code == 0);
}

// Trains into kDir/name; returns its per-step losses.
std::map<int64_t, double> train(const std::string& name, int np, const std::string& sets) {
  fs::remove_all(kDir / name);
  run_runner(np, "train", recipe_path(), "--run-dir " + (kDir / name).string() + " " + sets);
  return losses_of(kDir / name);
}

// `runner resume` of kDir/name; returns the per-step losses in its metrics (those after the
// checkpoint it resumed from, plus any the directory held up to it).
std::map<int64_t, double> resume(const std::string& name, int np, const std::string& sets) {
  run_runner(np, "resume", (kDir / name).string(), sets);
  return losses_of(kDir / name);
}

// A fresh run directory kDir/name holding only run `from`'s checkpoint `file` (as LATEST) and
// its resolved recipe: what resuming that checkpoint elsewhere starts from.
void seed_run_dir(const std::string& name, const std::string& from, const std::string& file) {
  fs::remove_all(kDir / name);
  fs::create_directories(kDir / name / "checkpoints");
  fs::copy_file(kDir / from / "checkpoints" / file, kDir / name / "checkpoints" / file);
  std::ofstream(kDir / name / "checkpoints" / "LATEST") << file << "\n";
  fs::copy_file(kDir / from / "recipe.yaml", kDir / name / "recipe.yaml");
}

// The logical parameters of a checkpoint, by name.
std::map<std::string, std::vector<float>> params_of(const fs::path& file, const std::vector<std::string>& sets = {}) {
  runner::Recipe r = runner::load_recipe(recipe_path(), sets);
  runner::Plan p = runner::make_plan(r, 1);
  const ops::Graph& g = p.layout->graph(0);
  runner::TrainState st;
  st.params = runner::init_params(g, r.model, 1);
  runner::load_checkpoint_file(file.string(), st);
  std::map<std::string, std::vector<float>> out;
  for (size_t i = 0; i < st.params.names.size(); ++i) {
    const float* v = st.params.values[i].data<float>();
    out[st.params.names[i]].assign(v, v + st.params.values[i].numel());
  }
  return out;
}

double max_rel(const std::map<int64_t, double>& a, const std::map<int64_t, double>& b) {
  double worst = 0;
  for (auto& [step, la] : a) {
    auto it = b.find(step);
    REQUIRE(it != b.end());
    worst = std::max(worst, std::abs(la - it->second) / std::abs(la));
  }
  return worst;
}

// ||a - b|| / ||a|| over all parameters together. Not element by element: some elements have
// an analytically zero gradient (the key slice of the qkv bias: softmax ignores a constant
// added to every score of a row), so their computed gradient is pure rounding noise, which
// Adam normalises into steps of +-lr whose signs differ between summation orders. Those
// elements differ by ~lr between layouts in any implementation; they are ~1e-4 of their
// tensor but ~1e-7 of the model, which is what this measures.
double max_param_rel(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (auto& [name, va] : a) {
    auto it = b.find(name);
    REQUIRE_MESSAGE(it != b.end(), name);
    REQUIRE(it->second.size() == va.size());
    for (size_t i = 0; i < va.size(); ++i) {
      double d = static_cast<double>(va[i]) - it->second[i];
      diff += d * d;
      norm += static_cast<double>(va[i]) * va[i];
    }
  }
  REQUIRE(norm > 0);
  return std::sqrt(diff / norm);
}

// Invariant 4 on every layout: rank 0's measured peak of each account against the plan's
// prediction for its stage (from the run's summary record).
void check_ledger(const fs::path& run) { test_support::check_ledger(run); }

const std::map<int64_t, double>& serial() {
  static std::map<int64_t, double> s = train("serial", 0, "");
  return s;
}

}  // namespace

TEST_CASE("every dp x tp x pp layout reproduces the single-rank run") {
  const auto& base = serial();
  REQUIRE(base.size() == 10);
  auto base_params = params_of(kDir / "serial" / "checkpoints" / "step_00000010.h5");
  const test_support::Layout layouts[] = {
      {"dp2", 2, "--set parallel.dp=2"},
      {"tp2", 2, "--set parallel.tp=2"},
      {"pp2", 2, "--set parallel.pp=2"},
      {"dp2tp2", 4, "--set parallel.tp=2"},
      {"dp2pp2", 4, "--set parallel.pp=2"},
      {"tp2pp2", 4, "--set parallel.tp=2 --set parallel.pp=2"},
      {"dp2tp2pp2", 8, "--set parallel.tp=2 --set parallel.pp=2"},
      {"dp2zero1", 2, "--set parallel.zero=1"},
      {"dp2tp2zero1_bucket", 4, "--set parallel.tp=2 --set parallel.zero=1 --set parallel.bucket_mb=0.01"},
      {"pp2gpipe", 2, "--set parallel.pp=2 --set parallel.schedule=gpipe"},
      // Sequence parallelism (Korthikanti et al.): norms, dropout and residuals on sequence shards.
      {"tp2sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"tp2pp2sp", 4, "--set parallel.tp=2 --set parallel.pp=2 --set parallel.sequence_parallel=true"},
      {"dp2tp2sp_zero1", 4, "--set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.zero=1"},
      {"tp2sp_recompute", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true --set recompute.mode=full"},
  };
  for (const test_support::Layout& l : layouts) {
    CAPTURE(l.name);
    auto losses = train(l.name, l.np, l.sets);
    CHECK(losses.size() == base.size());
    CHECK(max_rel(base, losses) < 1e-5);
    CHECK(max_param_rel(base_params, params_of(kDir / l.name / "checkpoints" / "step_00000010.h5")) < 1e-5);
    check_ledger(kDir / l.name);
  }
}

// Grouped-query attention under tensor parallelism: with tp dividing the key-value heads each
// rank holds its share; otherwise (one key-value head over tp 2: multi-query) every rank holds
// all of them and the replicated rows' gradients are summed over tp (and counted once in the
// clipping norm, which grad_clip 1.0 makes matter). Each against its own single-rank run.
TEST_CASE("grouped-query attention: key-value heads split over tp or replicated reproduce the single-rank run") {
  for (int kv : {2, 1}) {
    CAPTURE(kv);
    const std::string gqa = "--set model.n_kv_heads=" + std::to_string(kv);
    const std::string pre = "gqa" + std::to_string(kv) + "_";
    const auto base = train(pre + "serial", 0, gqa);
    REQUIRE(base.size() == 10);
    const std::vector<std::string> sets = {"model.n_kv_heads=" + std::to_string(kv)};
    auto base_params = params_of(kDir / (pre + "serial") / "checkpoints" / "step_00000010.h5", sets);
    const test_support::Layout layouts[] = {
        {"tp2", 2, "--set parallel.tp=2"},
        {"tp2sp", 2, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
        {"dp2tp2zero1", 4, "--set parallel.tp=2 --set parallel.zero=1 --set parallel.bucket_mb=0.01"},
    };
    for (const test_support::Layout& l : layouts) {
      if (kv == 2 && l.np == 4) continue;  // the split case's ZeRO path is the plain one's
      CAPTURE(l.name);
      const std::string name = pre + l.name;
      auto losses = train(name, l.np, gqa + " " + l.sets);
      CHECK(losses.size() == base.size());
      CHECK(max_rel(base, losses) < 1e-5);
      CHECK(max_param_rel(base_params, params_of(kDir / name / "checkpoints" / "step_00000010.h5", sets)) < 1e-5);
      check_ledger(kDir / name);
    }
  }
}

TEST_CASE("the summary reports the layout, hidden communication and pipeline idle time") {
  train("report", 4, "--set parallel.pp=2");
  nlohmann::json summary = last_with(kDir / "report", "summary");
  int steps_with_comm = 0;
  for (auto& j : records(kDir / "report"))
    if (j.contains("comm_hidden_ms") && j.contains("step")) steps_with_comm++;
  REQUIRE(summary.is_object());
  CHECK(summary["layout"]["dp"] == 2);
  CHECK(summary["layout"]["pp"] == 2);
  CHECK(summary["plan_bubble"].get<double>() == doctest::Approx(1.0 / 3.0));  // (p-1)/(m+p-1), m = 2
  REQUIRE(summary["pipeline_idle_fraction"].size() == 2);
  for (auto& f : summary["pipeline_idle_fraction"]) CHECK(f.get<double>() > 0.0);
  double hf = summary["comm_hidden_fraction"].get<double>();
  CHECK(hf >= 0.0);
  CHECK(hf <= 1.0);
  CHECK(steps_with_comm == 10);
}

TEST_CASE("resume is bitwise on the same layout and continues the curve on another layout") {
  const auto& base = serial();
  // A dp2 x tp2 ZeRO-1 run whose checkpoint of step 5 seeds every resume below.
  auto full = train("src", 4, "--set parallel.tp=2 --set parallel.zero=1");
  SUBCASE("same layout: bit for bit") {
    seed_run_dir("same", "src", "step_00000005.h5");
    auto r = resume("same", 4, "");
    REQUIRE(r.size() == 5);
    for (auto& [step, loss] : r) CHECK(loss == full.at(step));
    CHECK(max_param_rel(params_of(kDir / "src" / "checkpoints" / "step_00000010.h5"),
                        params_of(kDir / "same" / "checkpoints" / "step_00000010.h5")) == 0.0);
  }
  SUBCASE("dp2 x tp2 -> one rank") {
    seed_run_dir("to1", "src", "step_00000005.h5");
    auto r = resume("to1", 0, "--set parallel.tp=1 --set parallel.zero=0");
    REQUIRE(r.size() == 5);
    CHECK(max_rel(r, base) < 1e-5);
    // The stored recipe's dp 2 and accum 2 were derived again for one rank (dp 1, accum 4).
    std::ifstream log(kDir / "to1" / "log.rank0.txt");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    CHECK(text.find("dp (was 2) and accum (was 2) derived again for the new layout, global batch 8") != std::string::npos);
  }
  SUBCASE("dp2 x tp2 -> pp2") {
    seed_run_dir("topp", "src", "step_00000005.h5");
    auto r = resume("topp", 2, "--set parallel.tp=1 --set parallel.zero=0 --set parallel.pp=2");
    REQUIRE(r.size() == 5);
    CHECK(max_rel(r, base) < 1e-5);
  }
  SUBCASE("one rank -> dp2 x tp2 with ZeRO-1") {
    seed_run_dir("from1", "serial", "step_00000005.h5");
    auto r = resume("from1", 4, "--set parallel.tp=2 --set parallel.zero=1");
    REQUIRE(r.size() == 5);
    CHECK(max_rel(r, base) < 1e-5);
  }
}

TEST_CASE("a world size that does not match the recipe, or an indivisible layout, is refused before anything is written") {
  recipe_path();
  struct Bad {
    int np;
    const char* sets;
    const char* where;   // the error's location: the recipe's file:line:col, or the --set that caused it
    const char* expect;
  };
  const Bad bad[] = {
      {3, "", "layout.yaml:", "not divisible by micro 2 x dp 3"},       // global 8 over dp 3
      {3, "--set parallel.tp=2", "--set:", "world size 3 is not divisible by tp 2"},
      {2, "--set parallel.dp=4", "--set:", "world size 2 != dp 4"},
      {2, "--set parallel.tp=3", "--set:", "not divisible by tp 3"},
      {4, "--set parallel.pp=4", "--set:", "every pipeline stage needs at least one layer"},
      {2, "--set parallel.tp=2 --set model.n_heads=3 --set model.d_model=66", "--set:", "n_heads"},
      {0, "--set parallel.dp=2", "--set:", "needs 2 ranks"},  // a multi-rank recipe started without mpirun
  };
  for (const Bad& b : bad) {
    fs::path dir = kDir / "refused";
    fs::remove_all(dir);
    std::string cmd = (b.np ? mpirun(b.np) : std::string()) + RUNNER_BINARY + " train " + recipe_path() + " --quiet --run-dir " + dir.string() + " " + b.sets;
    Result r = sh(cmd);
    INFO(cmd << "\n" << r.out);
    CHECK(r.code == 2);
    CHECK(r.out.find(b.expect) != std::string::npos);
    CHECK(r.out.find(b.where) != std::string::npos);
    CHECK_FALSE(fs::exists(dir));
  }
}

TEST_CASE("a rank that fails stops the whole job with its message, and no checkpoint is half written") {
  fs::path dir = kDir / "fault";
  fs::remove_all(dir);
  std::string cmd = "RUNNER_FAULT_FAIL_RANK=1 RUNNER_FAULT_FAIL_STEP=7 timeout 120 " + mpirun(2) + RUNNER_BINARY + " train " +
                    recipe_path() + " --quiet --run-dir " + dir.string() + " --set parallel.pp=2";
  Result r = sh(cmd);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // stopped promptly, not by the timeout
  CHECK(r.out.find("injected fault at step 7") != std::string::npos);
  CHECK(r.out.find("dp0.tp0.pp1") != std::string::npos);  // the failing rank, by its coordinates
  auto steps = runner::list_checkpoint_steps((dir / "checkpoints").string());
  CHECK(steps == std::vector<int64_t>{5});
  for (int64_t s : steps) CHECK_NOTHROW(runner::verify_checkpoint_file((dir / "checkpoints" / runner::checkpoint_file_name(s)).string()));
}

TEST_CASE("greedy evaluation gives the same accuracy on every layout") {
  // A model trained long enough to get some held-out additions right (about half of them here), then
  // evaluated by resuming its final checkpoint on other layouts: tensor parallelism picks the
  // argmax over vocabulary shards, pipeline parallelism sends each chosen digit back to the
  // first stage. Logits differ between layouts by rounding only, so accuracy may differ by a
  // near-tie at most.
  const std::string sets =
      "--set train.steps=500 --set optimizer.lr=0.003 --set batch.global=16 --set model.dropout=0 "
      "--set train.eval_every=0 --set checkpoint.every_steps=500";
  train("acc", 0, sets);
  auto last_eval = [](const fs::path& run) {
    nlohmann::json e = last_with(run, "eval");
    REQUIRE(e.contains("accuracy"));
    return e;
  };
  nlohmann::json base = last_eval(kDir / "acc");
  CHECK(base["accuracy"].get<double>() > 0.02);
  struct L {
    const char* name;
    int np;
    const char* sets;
  };
  for (const L& l : {L{"acc_tp2", 2, "--set parallel.tp=2"}, L{"acc_pp2", 2, "--set parallel.pp=2"},
                     L{"acc_tp2pp2", 4, "--set parallel.tp=2 --set parallel.pp=2"}}) {
    CAPTURE(l.name);
    seed_run_dir(l.name, "acc", "step_00000500.h5");
    resume(l.name, l.np, l.sets);
    nlohmann::json e = last_eval(kDir / l.name);
    CHECK(std::abs(e["accuracy"].get<double>() - base["accuracy"].get<double>()) <= 1.0 / 256 + 1e-12);
    CHECK(std::abs(e["val_loss"].get<double>() - base["val_loss"].get<double>()) <= 1e-5 * base["val_loss"].get<double>());
  }
}

TEST_CASE("a multi-rank run stopped at any moment resumes bit for bit") {
  // Straight through, then the same run killed (SIGKILL to the whole job) or stopped (SIGTERM
  // to mpirun, which forwards it to every rank) once a checkpoint exists, then resumed. The
  // steps after the resume point must reproduce the straight run's losses exactly.
  const std::string sets =
      "--set parallel.pp=2 --set parallel.dp=1 --set train.steps=600 --set checkpoint.every_steps=25 "
      "--set train.eval_every=0 --set train.log_every=1000";
  auto straight = train("straight", 2, sets);
  REQUIRE(straight.size() == 600);
  for (const char* how : {"KILL", "TERM"}) {
    CAPTURE(how);
    fs::path dir = kDir / (std::string("stopped_") + how);
    fs::remove_all(dir);
    fs::path pidfile = kDir / "mpirun.pid";
    std::string cmd = mpirun(2) + RUNNER_BINARY + " train " + recipe_path() + " --quiet --run-dir " + dir.string() + " " +
                      sets + " > /dev/null 2>&1 & echo $! > " + pidfile.string();
    REQUIRE(sh(cmd).code == 0);
    std::string pid;
    std::ifstream(pidfile) >> pid;
    REQUIRE(!pid.empty());
    // Wait for the second checkpoint, then stop the job wherever it is.
    for (int i = 0; i < 600 && !fs::exists(dir / "checkpoints" / "step_00000050.h5"); ++i) ::usleep(20000);
    REQUIRE(fs::exists(dir / "checkpoints" / "step_00000050.h5"));
    if (std::string(how) == "KILL") {
      sh("kill -KILL " + pid + "; pkill -KILL -f -- '[-]-run-dir " + dir.string() + "'");
    } else {
      sh("kill -TERM " + pid);
    }
    // Wait for every rank to be gone ("[-]" keeps the pattern from matching pgrep's own shell).
    for (int i = 0; i < 1500 && sh("pgrep -f -- '[-]-run-dir " + dir.string() + "' > /dev/null").code == 0; ++i) ::usleep(20000);
    auto steps = runner::list_checkpoint_steps((dir / "checkpoints").string());
    REQUIRE(!steps.empty());
    int64_t from = steps.back();
    CHECK(from < 600);
    auto resumed = resume(dir.filename().string(), 2, "");
    REQUIRE(resumed.size() == 600);
    int mismatches = 0;
    for (auto& [step, loss] : straight) mismatches += resumed.at(step) != loss;
    CHECK(mismatches == 0);
    CHECK(max_param_rel(params_of(kDir / "straight" / "checkpoints" / "step_00000600.h5"),
                        params_of(dir / "checkpoints" / "step_00000600.h5")) == 0.0);
  }
}

TEST_CASE("the interleaved 1F1B schedule reproduces the single-rank run and resumes on another layout") {
  // Four layers so that two stages hold two one-layer chunks each (virtual stages 0..3 on
  // ranks 0,1,0,1), micro-batches going round the pipeline twice.
  const std::string four = "--set model.n_layers=4 ";
  auto base = train("il_serial", 0, four);
  auto base_params = params_of(kDir / "il_serial" / "checkpoints" / "step_00000010.h5", {"model.n_layers=4"});
  struct L {
    const char* name;
    int np;
    const char* sets;
  };
  const std::string il = "--set parallel.pp=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2 ";
  for (const L& l : {L{"il_pp2", 2, ""}, L{"il_dp2pp2", 4, "--set parallel.dp=2"},
                     L{"il_tp2pp2sp", 4, "--set parallel.tp=2 --set parallel.sequence_parallel=true"}}) {
    CAPTURE(l.name);
    auto losses = train(l.name, l.np, four + il + l.sets);
    CHECK(losses.size() == base.size());
    CHECK(max_rel(base, losses) < 1e-5);
    CHECK(max_param_rel(base_params, params_of(kDir / l.name / "checkpoints" / "step_00000010.h5", {"model.n_layers=4"})) < 1e-5);
    check_ledger(kDir / l.name);
  }
  // Its step-5 checkpoint, resumed on one rank, continues the serial curve.
  seed_run_dir("il_to1", "il_pp2", "step_00000005.h5");
  auto resumed = resume("il_to1", 0, "--set parallel.pp=1 --set parallel.schedule=1f1b --set parallel.virtual_stages=1");
  REQUIRE(resumed.size() == 5);  // steps 6..10
  CHECK(max_rel(resumed, base) < 1e-5);
}

TEST_CASE("ranks on one machine share its cores unless told otherwise") {
  // Four ranks, no OMP_NUM_THREADS and train.threads 0: each rank takes cores / 4 threads
  // (OpenMP alone would give each of them every core).
  fs::path dir = kDir / "threads";
  fs::remove_all(dir);
  std::string cmd = "env -u OMP_NUM_THREADS " + std::string(RUNNER_MPIEXEC) + " -np 4 --oversubscribe " + RUNNER_BINARY +
                    " train " + recipe_path() + " --quiet --run-dir " + dir.string() +
                    " --set train.threads=0 --set train.steps=2 --set parallel.dp=4";
  Result r = sh("timeout 300 " + cmd);
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream in(dir / "log.rank0.txt");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const unsigned share = std::max(1u, std::thread::hardware_concurrency() / 4);
  CHECK(log.find("threads    " + std::to_string(share) + " per rank") != std::string::npos);
}
