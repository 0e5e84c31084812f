// The shared small models, recipes and runs (recipes.h).
#include "tests/support/recipes.h"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace test_support {

fs::path write_layout_recipe(const fs::path& dir, const std::string& file) {
  fs::create_directories(dir);
  const fs::path p = dir / file;
  std::ofstream(p) << kLayoutRecipe;
  return p;
}

std::string LayoutScratch::recipe() const {
  if (recipe_.empty()) recipe_ = write_layout_recipe(dir_.path);
  return recipe_.string();
}

std::string quickstart_recipe() { return std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml"; }
std::string quickstart_llama_recipe() { return std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart-llama.yaml"; }

std::vector<nlohmann::json> metrics_records(const fs::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::map<int64_t, double> step_losses(const fs::path& run_dir, bool skip_summary) {
  std::map<int64_t, double> losses;
  for (const nlohmann::json& j : metrics_records(run_dir))
    if (j.contains("loss") && j.contains("step") && !j.contains("eval") && !j.contains("rollback") &&
        !(skip_summary && j.contains("summary")))
      losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
  return losses;
}

void check_ledger(const fs::path& run_dir) {
  nlohmann::json summary;
  for (const nlohmann::json& j : metrics_records(run_dir))
    if (j.contains("summary")) summary = j;
  REQUIRE(summary.contains("ledger"));
  for (auto& [account, v] : summary["ledger"].items()) {
    CAPTURE(account);
    double predicted = v["predicted"].get<double>(), measured = v["measured"].get<double>();
    if (predicted == 0) CHECK(measured == 0);
    else CHECK(std::abs(measured - predicted) <= 0.05 * predicted);
  }
}

std::string tiny_quickstart_args(const fs::path& run, int steps, int seq_len) {
  const std::string n = std::to_string(steps);
  return "train " + quickstart_recipe() + " --quiet --run-dir " + run.string() + " --set train.steps=" + n +
         " train.eval_every=0 checkpoint.every_steps=" + n + " model.d_model=32 model.n_heads=2 model.seq_len=" +
         std::to_string(seq_len);
}

TinyQuickstartRun::TinyQuickstartRun(const std::string& name, int steps, const std::string& lr, const std::string& extra) {
  dir = fresh_dir(name, "run");
  run = dir / "run";
  const SplitResult r = runner_split(tiny_quickstart_args(run, steps, 32) + " optimizer.lr=" + lr + " " + extra, dir);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
}

TinyQuickstartRun::~TinyQuickstartRun() {
  std::error_code ec;
  fs::remove_all(dir, ec);
}

const TinyQuickstartRun& tiny_quickstart(const std::string& name, int steps, const std::string& lr, const std::string& extra) {
  static std::map<std::string, std::unique_ptr<TinyQuickstartRun>> made;
  std::unique_ptr<TinyQuickstartRun>& r = made[name];
  if (!r) r = std::make_unique<TinyQuickstartRun>(name, steps, lr, extra);
  return *r;
}

namespace quickstart {

namespace {

// Mean training loss per 250-step window over the first 1500 steps (NaN for a window with none).
std::vector<double> window_means(std::map<int64_t, double>& loss) {
  std::vector<double> means;
  for (int64_t w = 0; w < 6; ++w) {
    double s = 0;
    int n = 0;
    for (int64_t k = w * 250 + 1; k <= (w + 1) * 250; ++k)
      if (loss.count(k) && std::isfinite(loss[k])) { s += loss[k]; ++n; }
    means.push_back(n ? s / n : NAN);
  }
  return means;
}

// What one quickstart run's metrics say.
Run read_run(const fs::path& run) {
  Run r;
  std::map<int64_t, double> loss;
  for (const nlohmann::json& j : metrics_records(run)) {
    if (j.contains("eval")) {
      if (r.first_val < 0) r.first_val = j["val_loss"];
      r.last_val = j["val_loss"];
      r.accuracy = j["accuracy"];
    } else if (j.contains("loss") && !j.contains("summary") && !j.contains("rollback")) {
      loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
  }
  r.window_means = window_means(loss);
  return r;
}

}  // namespace

Run train(const std::string& precision, const std::string& recipe) {
  const TempDir dir("quickstart_" + precision);
  const fs::path run = dir / "run";
  const Result res = sh(binary() + " train " + recipe + " --quiet --run-dir " + run.string() +
                        " --set precision.compute=" + precision);
  INFO(res.out);
  REQUIRE(res.code == 0);
  return read_run(run);
}

std::vector<Run> train_at_once(const std::vector<std::string>& precisions, const std::string& recipe) {
  const TempDir dir("quickstart_at_once");
  std::string cmd;
  for (const std::string& p : precisions) {
    const fs::path run = dir / p;
    cmd += "{ " + binary() + " train " + recipe + " --quiet --run-dir " + run.string() + " --set precision.compute=" +
           p + " --set train.threads=1 > " + (dir / (p + ".log")).string() + " 2>&1; echo $? > " +
           (dir / (p + ".rc")).string() + "; } &\n";
  }
  sh(cmd + "wait");
  std::vector<Run> runs;
  for (const std::string& p : precisions) {
    CAPTURE(p);
    INFO(slurp(dir / (p + ".log")));
    REQUIRE(slurp(dir / (p + ".rc")) == "0\n");
    runs.push_back(read_run(dir / p));
  }
  return runs;
}

const Run& fp32() {
  static Run r = train("fp32");
  return r;
}

void check_learns(const Run& r) {
  CHECK(r.first_val > 0);
  CHECK(r.last_val < 0.5 * r.first_val);  // held-out loss falls
  CHECK(r.accuracy >= 0.9);
}

}  // namespace quickstart

}  // namespace test_support
