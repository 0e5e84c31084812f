// The plan: batch-equation derivation and every error path, layout rules, world size.
#include <doctest/doctest.h>

#include <regex>
#include <sstream>

#include <string>

#include "runner/plan/plan.h"
#include "runner/plan/relayout.h"
#include "runner/recipe/recipe.h"
#include "tests/support/errors.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

using namespace runner;

namespace {

const char* kBase = R"(name: t
model:
  vocab_size: 1000
  seq_len: 64
  d_model: 128
  n_layers: 4
  n_heads: 8
parallel:
  dp: 4
batch:
  global: 64
  micro: 4
  accum: 4
)";

Plan plan_of(std::vector<std::string> sets, int64_t world = 0) {
  return make_plan(load_recipe_text(kBase, "t.yaml", sets), world);
}

std::string error_of(std::vector<std::string> sets, int64_t world = 0) {
  try {
    plan_of(std::move(sets), world);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("batch equation: all three consistent") {
  Plan p = plan_of({});
  CHECK(p.global == 64);
  CHECK(p.micro == 4);
  CHECK(p.accum == 4);
  CHECK(p.derived.empty());
  CHECK(p.tokens_per_step == 64 * 64);
}

TEST_CASE("batch equation: any one left out is derived") {
  Plan a = make_plan(load_recipe_text(std::string(kBase).replace(std::string(kBase).find("  accum: 4\n"), 11, ""), "t.yaml"));
  CHECK(a.accum == 4);
  CHECK(a.derived == std::vector<std::string>{"accum"});
  Plan m = make_plan(load_recipe_text(std::string(kBase).replace(std::string(kBase).find("  micro: 4\n"), 11, ""), "t.yaml"));
  CHECK(m.micro == 4);
  CHECK(m.derived == std::vector<std::string>{"micro"});
  Plan g = make_plan(load_recipe_text(std::string(kBase).replace(std::string(kBase).find("  global: 64\n"), 13, ""), "t.yaml"));
  CHECK(g.global == 64);
  CHECK(g.derived == std::vector<std::string>{"global"});
}

TEST_CASE("batch equation: inconsistent numbers name the equation, the numbers and a fix, at batch.global") {
  std::string e = error_of({"batch.accum=3"});
  CHECK(e.rfind("t.yaml:11:", 0) == 0);
  CHECK(e.find("global 64 != micro 4 x dp 4 x accum 3 = 48") != std::string::npos);
  CHECK(e.find("set accum 4") != std::string::npos);
  e = error_of({"batch.micro=3"});
  CHECK(e.find("global 64 != micro 3 x dp 4 x accum 4 = 48") != std::string::npos);
  CHECK(e.find("set micro 4") != std::string::npos);
}

TEST_CASE("batch equation: indivisible derivations suggest the nearest valid choices") {
  Recipe r = load_recipe_text(kBase, "t.yaml", {"batch.micro=3"});
  r.batch.accum = 0;
  std::string s = test_support::expect_user_error([&] { make_plan(r); }).what();
  CHECK(s.find("global batch 64 is not divisible by micro 3 x dp 4 = 12") != std::string::npos);
  CHECK(s.find("try micro 2 or 4") != std::string::npos);
  r = load_recipe_text(kBase, "t.yaml", {"batch.accum=3"});
  r.batch.micro = 0;
  s = test_support::expect_user_error([&] { make_plan(r); }).what();
  CHECK(s.find("not divisible by accum 3 x dp 4 = 12") != std::string::npos);
  CHECK(s.find("try accum 2 or 4") != std::string::npos);
  r = load_recipe_text(kBase, "t.yaml", {"batch.global=66"});
  r.batch.micro = 0;
  CHECK_THROWS_WITH_AS(make_plan(r), doctest::Contains("global must be a multiple of dp 4: try global 68"), UserError);
}

TEST_CASE("resuming on another layout: dp and accum are derived again unless the overrides give them") {
  // The overrides keep the layout: the stored numbers stand.
  Recipe same = load_recipe_text(kBase, "t.yaml", {"train.steps=5"});
  CHECK(rederive_for_new_layout(same).empty());
  CHECK(same.parallel.dp == 4);
  CHECK(same.batch.accum == 4);
  // A new layout: both derived again for the new world, the global batch kept.
  Recipe tp = load_recipe_text(kBase, "t.yaml", {"parallel.tp=2"});
  CHECK(rederive_for_new_layout(tp) == std::vector<std::string>{"dp (was 4)", "accum (was 4)"});
  Plan p = make_plan(tp, 2);
  CHECK(p.global == 64);
  CHECK(p.accum == 16);
  // What the overrides give stays: dp, or (any batch.* field) accum.
  Recipe dp = load_recipe_text(kBase, "t.yaml", {"parallel.dp=2"});
  CHECK(rederive_for_new_layout(dp) == std::vector<std::string>{"accum (was 4)"});
  CHECK(dp.parallel.dp == 2);
  CHECK(make_plan(dp, 2).accum == 8);
  Recipe accum = load_recipe_text(kBase, "t.yaml", {"parallel.tp=2", "batch.accum=8"});
  CHECK(rederive_for_new_layout(accum) == std::vector<std::string>{"dp (was 4)"});
  CHECK(accum.batch.accum == 8);
  CHECK(make_plan(accum, 4).global == 64);
}

TEST_CASE("layout rules: heads, MLP width, layers over stages, micro-batches for a pipeline") {
  CHECK(error_of({"parallel.tp=3", "parallel.dp=1", "batch.global=16"}).find("model.n_heads 8 is not divisible by parallel.tp 3") != std::string::npos);
  CHECK(error_of({"parallel.pp=3", "parallel.dp=1", "batch.global=12", "batch.micro=4", "batch.accum=3"})
            .find("model.n_layers 4 does not split evenly over parallel.pp 3 stages") != std::string::npos);
  CHECK(error_of({"parallel.pp=3", "parallel.dp=1", "batch.global=12", "batch.micro=4", "batch.accum=3"})
            .find("parallel.stage_layers: [1, 1, 2]") != std::string::npos);
  std::string e = error_of({"parallel.pp=4", "parallel.dp=1", "batch.global=8", "batch.micro=4", "batch.accum=2"});
  CHECK(e.find("a 4-stage pipeline needs at least 4 micro-batches per step, got accum 2") != std::string::npos);
  Plan p = plan_of({"parallel.pp=2", "parallel.dp=1", "batch.global=16", "batch.micro=4", "batch.accum=4",
                    "parallel.stage_layers=[1,3]"});
  CHECK(p.stage_layers == std::vector<int64_t>{1, 3});
  CHECK(p.stages[0].last_layer == 1);
  CHECK(p.stages[1].first_layer == 1);
  CHECK(p.bubble == doctest::Approx(1.0 / 5.0));
}

TEST_CASE("vocabulary is padded to a multiple of tp, and the plan says so") {
  Plan p = plan_of({"model.vocab_size=1001", "parallel.tp=4", "parallel.dp=1", "batch.global=16"});
  CHECK(p.vocab_padded == 1004);
  bool said = false;
  for (auto& n : p.notes) said |= n.find("vocabulary padded from 1001 to 1004") != std::string::npos;
  CHECK(said);
}

TEST_CASE("world size must match the recipe's layout") {
  std::string e = error_of({}, 6);
  CHECK(e.find("world size 6 != dp 4 x tp 1 x pp 1 = 4") != std::string::npos);
  CHECK(e.find("mpirun -np 4") != std::string::npos);
  CHECK(e.rfind("t.yaml:9:", 0) == 0);  // at parallel.dp
  e = error_of({"parallel.tp=2", "parallel.dp=2", "batch.global=32"}, 5);
  CHECK(e.find("world size 5 is not divisible by tp 2 x pp 1 = 2") != std::string::npos);
  Plan p = plan_of({}, 4);
  CHECK(p.world == 4);
}

TEST_CASE("a plan that does not fit suggests changes that were verified to fit") {
  Recipe r = load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/does-not-fit.yaml");
  Plan p = make_plan(r);
  CHECK_FALSE(p.fits);
  REQUIRE(!p.suggestions.empty());
  CHECK(p.suggestions[0].find(" -> ") != std::string::npos);
  // Each states the batch equation it implies, with the global batch kept.
  const std::regex eq(R"(-> global (\d+) = micro (\d+) x dp (\d+) x accum (\d+), )");
  for (const std::string& s : p.suggestions) {
    if (s.rfind("more devices", 0) == 0) continue;
    INFO(s);
    std::smatch m;
    REQUIRE(std::regex_search(s, m, eq));
    CHECK(std::stoll(m[1]) == p.global);
    CHECK(std::stoll(m[1]) == std::stoll(m[2]) * std::stoll(m[3]) * std::stoll(m[4]));
  }
  CHECK(p.table().find("DOES NOT FIT") != std::string::npos);
  CHECK(p.table().find("what would fit") != std::string::npos);
}

TEST_CASE("every shipped recipe plans, and plan.json carries the ledger") {
  for (const char* name : {"quickstart", "gpt2-124m", "llama-7b-8xh100", "llama-70b-64gpu"}) {
    CAPTURE(name);
    Plan p = make_plan(load_recipe(std::string(RUNNER_SOURCE_DIR) + "/recipes/" + name + ".yaml"));
    CHECK(p.fits);
    auto j = p.to_json();
    CHECK(j["stages"].size() == static_cast<size_t>(p.pp));
    CHECK(j["stages"][0]["total_bytes"].get<double>() == doctest::Approx(p.stages[0].total()));
    CHECK(j["batch"]["global"] == p.global);
  }
}

TEST_CASE("16-bit gradient accumulation is allowed, and the plan warns why it drifts") {
  auto has = [](const std::vector<std::string>& v, const std::string& what) {
    for (auto& s : v)
      if (s.find(what) != std::string::npos) return true;
    return false;
  };
  Plan ok = plan_of({"precision.compute=bf16"});
  CHECK_FALSE(has(ok.warnings, "grad_accum"));
  Plan bf = plan_of({"precision.compute=bf16", "precision.grad_accum=bf16"});
  CHECK(has(bf.warnings, "precision.grad_accum bf16: each of the 4 micro-batch additions"));
  CHECK(has(bf.warnings, "drift grows with accum"));
  Plan fp = plan_of({"precision.compute=fp16", "precision.grad_accum=fp16"});
  CHECK(has(fp.warnings, "overflows sooner"));
  Plan noop = plan_of({"precision.grad_accum=bf16"});
  CHECK(has(noop.notes, "has no effect with compute fp32"));
  // The gradients account shrinks with 16-bit accumulation (2 bytes per parameter, not 4).
  CHECK(bf.stages[0].gradients == doctest::Approx(ok.stages[0].gradients / 2));
}

TEST_CASE("independent layout problems are reported together; the schedule only when batch and split resolved") {
  // A batch equation that does not hold, n_heads not divisible by tp, n_layers not split by pp.
  std::string e = error_of({"batch.accum=3", "parallel.tp=3", "parallel.pp=3", "parallel.dp=1"});
  INFO(e);
  CHECK(e.find("batch equation does not hold") != std::string::npos);
  CHECK(e.find("model.n_heads 8 is not divisible by parallel.tp 3") != std::string::npos);
  CHECK(e.find("model.n_layers 4 does not split evenly over parallel.pp 3") != std::string::npos);
  CHECK(e.find("\n3 problems") != std::string::npos);
  CHECK(e.find("micro-batches per step") == std::string::npos);  // the schedule rule follows from both
  // Each problem on its own located line.
  std::istringstream in(e);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() == 4);
  for (size_t i = 0; i < 3; ++i) CHECK((lines[i].rfind("t.yaml:", 0) == 0 || lines[i].rfind("--set: ", 0) == 0));
}
