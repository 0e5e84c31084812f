// `plan --search --verify K` (runner/perf/verify.h): the top K candidates run for a few steps each
// under mpirun at the search's world size (2 ranks here), get a measured median step time, and are
// re-ranked by it, predicted beside measured; a candidate that cannot run is reported and ranked
// last; the trials' directory goes unless the user named it. Built on hand-made SearchResults (the
// search itself is test_search's), plus the pieces: the median of a metrics.jsonl with warm-up
// dropped, and the launcher inside and outside a Slurm allocation.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/perf/verify.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

// A candidate of the layout-test recipe (2 layers, d 64) with this layout and a made-up prediction.
SearchCandidate candidate(const fs::path& dir, int64_t dp, int64_t tp, int64_t pp, int64_t micro, double predicted_s,
                          const std::string& recompute = "none", const std::vector<std::string>& sets = {}) {
  static int n = 0;
  const fs::path file = test_support::write_layout_recipe(dir, "layout" + std::to_string(++n) + ".yaml");
  SearchCandidate c;
  c.dp = dp;
  c.tp = tp;
  c.pp = pp;
  c.micro = micro;
  c.accum = 8 / (dp * micro);
  c.schedule = "1f1b";
  c.recompute = recompute;
  c.recipe = load_recipe(file.string(), sets);
  // The layout filled into the recipe, as the search fills it (SearchCandidate::recipe).
  c.recipe.parallel.dp = dp;
  c.recipe.parallel.tp = tp;
  c.recipe.parallel.pp = pp;
  c.recipe.batch.micro = micro;
  c.recipe.batch.accum = c.accum;
  if (recompute != "none") c.recipe.recompute.mode = *runner::parse_enum<runner::RecomputeMode>(recompute);
  c.predicted.step_s = predicted_s;
  return c;
}

VerifyOptions options(int k) {
  VerifyOptions o;
  o.k = k;
  o.steps = 5;
  o.runner = RUNNER_BINARY;
  return o;
}

// The temporary trial directories verify makes (runner_verify_*), for checking it removes its own.
int verify_dirs() {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    n += e.path().filename().string().rfind("runner_verify_", 0) == 0;
  return n;
}

}  // namespace

TEST_CASE("the median step after the warm-up, from the step records only") {
  test_support::TempDir dir("verify_median");
  std::ofstream(dir / "metrics.jsonl") << R"({"step": 1, "step_ms": 900, "breakdown": {}}
{"step": 2, "step_ms": 500, "breakdown": {}}
{"step": 3, "step_ms": 120, "breakdown": {}}
{"eval": true, "step": 3, "loss": 2.0}
{"step": 4, "step_ms": 100, "breakdown": {}}
{"step": 5, "step_ms": 300, "breakdown": {}}
{"step": 6, "step_ms": 110, "breakdown": {}}
{"monitor": true, "step": 6, "step_ms": {"p50": 1}}
{"summary": true, "step_ms": 7}
)";
  CHECK(verify_warmup(6) == 2);
  CHECK(verify_warmup(3) == 1);
  // Steps 3..6: 100, 110, 120, 300 -> (110 + 120) / 2 ms.
  CHECK(median_step_s(dir.file("metrics.jsonl"), 2).value() == doctest::Approx(0.115));
  // Steps 2..6: 500, 120, 100, 300, 110 -> 120 ms.
  CHECK(median_step_s(dir.file("metrics.jsonl"), 1).value() == doctest::Approx(0.120));
  CHECK(!median_step_s(dir.file("metrics.jsonl"), 6).has_value());
  CHECK(!median_step_s(dir.file("missing.jsonl"), 1).has_value());
}

TEST_CASE("the launcher: the runner alone for one rank, mpirun for more, srun inside a Slurm allocation") {
  const char* saved = std::getenv("SLURM_JOB_ID");
  unsetenv("SLURM_JOB_ID");
  CHECK(trial_launcher(1).empty());
  CHECK(trial_launcher(2) == std::vector<std::string>{"mpirun", "-np", "2"});
  setenv("SLURM_JOB_ID", "42", 1);
  CHECK(trial_launcher(4) == std::vector<std::string>{"srun", "-n", "4"});
  if (saved) setenv("SLURM_JOB_ID", saved, 1);
  else unsetenv("SLURM_JOB_ID");
}

TEST_CASE("--verify on 2 ranks: both candidates measured, re-ranked by measured step, the table shows both") {
  test_support::TempDir dir("verify_two");
  SearchResult res;
  res.world = 2;
  // The predicted best (dp2) trains a model 3x wider on 2x longer sequences, so it measures
  // clearly slower: the order after --verify must come from the measurement. A third candidate
  // is beyond K and stays unmeasured, after the measured ones.
  res.candidates.push_back(candidate(dir, 2, 1, 1, 2, 0.010, "full", {"model.d_model=192", "model.seq_len=64"}));
  res.candidates.push_back(candidate(dir, 1, 2, 1, 2, 0.020));
  res.candidates.push_back(candidate(dir, 1, 1, 2, 1, 0.001));
  const int before = verify_dirs();
  const VerifyReport rep = verify_layouts(res, options(2));
  CHECK(verify_dirs() == before);  // its temporary directory is gone
  CHECK(rep.work_dir.empty());
  REQUIRE(res.candidates.size() == 3);
  REQUIRE(rep.errors.size() == 3);
  for (int i = 0; i < 2; ++i) {
    INFO(i << ": " << rep.errors[i]);
    REQUIRE(res.candidates[i].measured_step_s.has_value());
    CHECK(*res.candidates[i].measured_step_s > 0);
    CHECK(rep.errors[i].empty());
  }
  CHECK(*res.candidates[0].measured_step_s <= *res.candidates[1].measured_step_s);
  CHECK(res.candidates[0].tp == 2);  // the light one, measured faster, now first
  CHECK(res.candidates[1].dp == 2);
  CHECK(!res.candidates[2].measured_step_s.has_value());
  CHECK(res.candidates[2].pp == 2);  // unmeasured, after the measured ones despite its prediction
  const std::string table = verify_table(res, rep);
  INFO(table);
  CHECK(table.find("predicted s") != std::string::npos);
  CHECK(table.find("measured s") != std::string::npos);
  CHECK(table.find("dp 2 x tp 1 x pp 1, micro 2 x accum 2, recompute full") != std::string::npos);
  CHECK(table.find("dp 1 x tp 2 x pp 1, micro 2 x accum 4, recompute none") != std::string::npos);
  nlohmann::json j = {{"search", {{"candidates", nlohmann::json::array()}}}};
  add_verify_json(j, res, rep);
  REQUIRE(j["search"]["candidates"].size() == 3);
  const auto& c0 = j["search"]["candidates"][0];
  CHECK(c0["measured_step_s"].get<double>() == doctest::Approx(*res.candidates[0].measured_step_s));
  CHECK(c0["measured_over_predicted"].get<double>() ==
        doctest::Approx(*res.candidates[0].measured_step_s / res.candidates[0].predicted.step_s));
  CHECK(j["search"]["candidates"][2]["measured_step_s"].is_null());
  CHECK(j["search"]["verify"]["world"] == 2);
}

TEST_CASE("--verify: a candidate that cannot run is reported and ranked last; a named directory is kept") {
  test_support::TempDir dir("verify_fail");
  SearchResult res;
  res.world = 2;
  // tp 3 does not divide 4 heads: `runner train` refuses it (exit 2), and verify says so.
  res.candidates.push_back(candidate(dir, 1, 3, 1, 2, 0.001));
  res.candidates.push_back(candidate(dir, 2, 1, 1, 4, 0.002));
  VerifyOptions o = options(2);
  o.work_dir = (dir / "trials").string();
  const VerifyReport rep = verify_layouts(res, o);
  REQUIRE(res.candidates[0].measured_step_s.has_value());
  CHECK(res.candidates[0].dp == 2);
  CHECK(!res.candidates[1].measured_step_s.has_value());
  CHECK(res.candidates[1].tp == 3);
  INFO(rep.errors[1]);
  CHECK(rep.errors[1].find("exit 2") != std::string::npos);
  CHECK(verify_table(res, rep).find("failed") != std::string::npos);
  CHECK(fs::exists(dir / "trials" / "candidate2" / "run" / "metrics.jsonl"));
  CHECK(fs::exists(dir / "trials" / "candidate1" / "output.txt"));
  CHECK(rep.work_dir == fs::absolute(dir / "trials").string());
}

TEST_CASE("--verify-steps below 2 leaves nothing to time: a user error") {
  SearchResult res;
  VerifyOptions o = options(1);
  o.steps = 1;
  CHECK_THROWS_AS(verify_layouts(res, o), UserError);
}

TEST_CASE("runner plan --search --world 2 --verify 2: exit 0, both measured, ordered by measured step, both columns") {
  test_support::TempDir dir("verify_cli");
  const fs::path recipe = test_support::write_layout_recipe(dir.path);
  const test_support::SplitResult r =
      test_support::runner_split("plan " + recipe.string() + " --search --world 2 --verify 2 --json", dir.path);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto& cands = j["search"]["candidates"];
  REQUIRE(cands.size() >= 2);
  CHECK(cands[0]["measured_step_s"].get<double>() > 0);
  CHECK(cands[1]["measured_step_s"].get<double>() > 0);
  CHECK(cands[0]["measured_step_s"].get<double>() <= cands[1]["measured_step_s"].get<double>());
  CHECK(cands[0]["predicted"]["step_s"].get<double>() > 0);
  CHECK(cands[0]["measured_over_predicted"].get<double>() ==
        doctest::Approx(cands[0]["measured_step_s"].get<double>() / cands[0]["predicted"]["step_s"].get<double>()));
  CHECK(j["search"]["verify"]["k"] == 2);
  CHECK(r.err.find("verify 1/2: dp ") != std::string::npos);
  CHECK(r.err.find("verify 2/2: dp ") != std::string::npos);
  // The human table: predicted beside measured.
  const test_support::Result t = test_support::runner_cmd("plan " + recipe.string() + " --search --world 2 --verify 2");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("predicted s  measured s meas/pred") != std::string::npos);
}
