// recompute.mode auto (runner/plan/recompute.cpp): a recipe that does not fit without
// recompute gets a choice that fits, taken in order of activation bytes saved per recomputed
// FLOP; a recipe that fits gets none; the choice is in plan.json, agrees with the ledger's own
// numbers, and a real `runner train` recomputes what the plan chose (its measured activation
// peak is the ledger's, within 5%).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/executor.h"
#include "runner/model/gpt.h"
#include "runner/plan/plan.h"
#include "runner/plan/plan_internal.h"
#include "runner/recipe/recipe.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

// Four layers, T = 256 so that the attention probabilities matter, 2 micro-batches per step;
// the CPU with a memory size the tests set, so that every plan is accounted alike.
const char* kBase = R"(name: t
model:
  vocab_size: 256
  seq_len: 256
  d_model: 128
  n_layers: 4
  n_heads: 4
batch:
  global: 8
  micro: 4
hardware:
  device: cpu
  memory_gb: 1000
)";

Plan plan_of(std::vector<std::string> sets) { return make_plan(load_recipe_text(kBase, "t.yaml", sets)); }

// A device of `bytes`.
std::vector<std::string> with_memory(std::vector<std::string> sets, double bytes) {
  sets.push_back(fmt::format("hardware.memory_gb={:.12f}", bytes / double(1ull << 30)));
  return sets;
}

double ratio(const RecomputeStep& s) { return s.bytes_saved / s.flops; }

// The per-layer module sets that the chosen steps amount to, derived here from the step names
// alone ("layer": everything plus the residual adds, as mode full; attention brings its core).
std::vector<ops::ModuleSet> sets_of(const std::vector<RecomputeStep>& chosen, int64_t n_layers) {
  using M = ops::Module;
  std::vector<ops::ModuleSet> sets(static_cast<size_t>(n_layers));
  for (const RecomputeStep& st : chosen) {
    ops::ModuleSet& s = sets[static_cast<size_t>(st.layer)];
    if (st.module == "layer") s |= {M::norm, M::attention_core, M::attention, M::mlp, M::residual};
    else if (st.module == "attention") s |= {M::attention, M::attention_core};
    else s |= {parse_enum<RecomputeModule>(st.module).value()};
  }
  return sets;
}

// The real ledger of plan `p` with its layout rebuilt from other per-layer sets.
Plan replanned(const Plan& p, std::vector<ops::ModuleSet> sets) {
  Plan q = p;
  GptSpec whole = p.layout->spec(0);
  whole.first_layer = 0;
  whole.last_layer = p.recipe.model.n_layers;
  whole.first_stage = whole.last_stage = true;
  whole.recompute = std::move(sets);
  q.layout = std::make_shared<const ModelLayout>(whole, p.stage_layers, p.chunks);
  plan_detail::compute_ledger(p.recipe, q);
  return q;
}

}  // namespace

TEST_CASE("auto on a recipe that fits chooses nothing, and plans exactly as mode none") {
  Plan none = plan_of({});
  Plan a = plan_of({"recompute.mode=auto"});
  REQUIRE(a.recompute_auto);
  CHECK(a.fits);
  CHECK(a.recompute_auto->chosen.empty());
  for (auto& s : a.recompute_auto->sets) CHECK(s.empty());
  CHECK(a.worst_stage().total() == none.worst_stage().total());
  CHECK(a.table().find("fits") != std::string::npos);
  CHECK_FALSE(none.recompute_auto);
  CHECK_FALSE(none.to_json().contains("recompute"));  // other modes' plan.json is unchanged
}

TEST_CASE("auto on a recipe that does not fit without recompute chooses steps until it fits") {
  const double none_total = plan_of({}).worst_stage().total();
  const double full_total = plan_of({"recompute.mode=full"}).worst_stage().total();
  REQUIRE(full_total < none_total);
  for (double f : {0.1, 0.5, 0.9}) {  // the device between full recompute's footprint and none's
    CAPTURE(f);
    const double device = none_total - f * (none_total - full_total);
    Plan none = plan_of(with_memory({}, device));
    CHECK_FALSE(none.fits);
    Plan a = plan_of(with_memory({"recompute.mode=auto"}, device));
    REQUIRE(a.recompute_auto);
    const RecomputeAuto& ra = *a.recompute_auto;
    CHECK(a.fits);
    CHECK(a.worst_stage().total() <= device);
    REQUIRE_FALSE(ra.chosen.empty());
    CHECK(ra.stages[0].before == doctest::Approx(none_total));
    // It stops as soon as it fits: the same order less its last step does not fit, on the real
    // ledger (the layout rebuilt from the shorter prefix).
    std::vector<RecomputeStep> shorter(ra.chosen.begin(), ra.chosen.end() - 1);
    CHECK(replanned(a, sets_of(shorter, 4)).worst_stage().total() > device);
    // The steps amount to the sets the layout was built with, and the plan's activations are
    // the executor's dry run of a graph built from those sets.
    CHECK(sets_of(ra.chosen, 4) == ra.sets);
    GptSpec spec = a.layout->spec(0);
    spec.recompute = sets_of(ra.chosen, 4);
    const ops::MemoryEstimate est = ops::Executor::simulate(build_gpt_graph(spec));
    CHECK(a.stages[0].activations_per_micro == static_cast<double>(est.activations_after_forward));
    CHECK(a.stages[0].activations == static_cast<double>(est.peak[static_cast<int>(ops::Account::Activations)]));
    CHECK(ra.stages[0].after == doctest::Approx(a.worst_stage().total()));
    // Bytes saved are the ledger's own: they add up to the drop in activations per micro-batch.
    double saved = 0;
    for (auto& c : ra.chosen) saved += c.bytes_saved;
    CHECK(saved == doctest::Approx(none.stages[0].activations_per_micro - a.stages[0].activations_per_micro).epsilon(1e-12));
    // The layout (what the trainer builds its graphs from) carries exactly the chosen sets.
    for (int64_t l = 0; l < 4; ++l) CHECK(a.layout->spec(0).recompute[static_cast<size_t>(l)] == ra.sets[static_cast<size_t>(l)]);
    // plan.json records it.
    auto j = a.to_json();
    REQUIRE(j.contains("recompute"));
    CHECK(j["recompute"]["mode"] == "auto");
    CHECK(j["recompute"]["chosen"].size() == ra.chosen.size());
    CHECK(j["recompute"]["chosen"][0]["module"] == ra.chosen[0].module);
    CHECK(j["recompute"]["chosen"][0]["bytes_saved"].get<double>() == ra.chosen[0].bytes_saved);
    CHECK(j["recompute"]["modules"].size() == 5);
    CHECK(j["recompute"]["rule_of_thumb"].is_array());
    CHECK(j["recompute"]["sets"].size() == 4);
    // The report says what and why, beside the rule of thumb.
    const std::string t = a.table();
    CHECK(t.find("recompute  auto: chose " + std::to_string(ra.chosen.size())) != std::string::npos);
    CHECK(t.find("rule of thumb") != std::string::npos);
    CHECK(t.find("without recompute >") != std::string::npos);
  }
}

TEST_CASE("auto takes steps in order of bytes saved per recomputed FLOP") {
  // A device nothing fits on: every step is taken, so the whole order is visible.
  Plan a = plan_of(with_memory({"recompute.mode=auto"}, 1.0));
  REQUIRE(a.recompute_auto);
  const RecomputeAuto& ra = *a.recompute_auto;
  CHECK_FALSE(a.fits);
  // Everything: each layer recomputed whole, as mode full does.
  Plan full = plan_of({"recompute.mode=full"});
  for (size_t l = 0; l < 4; ++l) CHECK(ra.sets[l] == full.layout->spec(0).recompute[l]);
  CHECK(a.stages[0].activations == full.stages[0].activations);
  // The first step is the best ratio alone; every step beats each step not yet open on an
  // untouched layer (the greedy invariant), and a layer's steps never save nothing.
  const RecomputeModuleCost* best = nullptr;
  for (auto& m : ra.modules)
    if (!best || m.bytes_saved / m.flops > best->bytes_saved / best->flops) best = &m;
  REQUIRE(best);
  CHECK(ra.chosen.front().module == best->module);
  std::set<int64_t> touched;
  for (const RecomputeStep& s : ra.chosen) {
    CAPTURE(s.layer);
    CAPTURE(s.module);
    CHECK(s.bytes_saved > 0);
    if (touched.size() < 4)
      for (auto& m : ra.modules) CHECK(ratio(s) >= m.bytes_saved / m.flops * (1 - 1e-12));
    touched.insert(s.layer);
  }
  // The greedy property, checked without the planner's own bookkeeping: a step taken later on a
  // layer that no step touched in between was already open, at the same price, when the earlier
  // step was taken, so the earlier one saves at least as many bytes per FLOP.
  for (size_t j = 0; j < ra.chosen.size(); ++j) {
    for (size_t i = j; i-- > 0;) {
      if (ra.chosen[i].layer == ra.chosen[j].layer) break;
      CAPTURE(i);
      CAPTURE(j);
      CHECK(ratio(ra.chosen[i]) >= ratio(ra.chosen[j]) * (1 - 1e-12));
    }
  }
  // Ratios of one step kind from an untouched layer come out equal for identical layers, in
  // layer order.
  std::vector<int64_t> first_kind;
  for (auto& s : ra.chosen)
    if (s.module == ra.chosen.front().module) first_kind.push_back(s.layer);
  CHECK(first_kind == std::vector<int64_t>{0, 1, 2, 3});
}

TEST_CASE("even full recompute does not fit: every step is taken, and the plan says so") {
  Plan a = plan_of(with_memory({"recompute.mode=auto"}, 1 << 20));
  REQUIRE(a.recompute_auto);
  CHECK_FALSE(a.fits);
  CHECK(a.recompute_auto->stages[0].after > a.device_memory);
  bool warned = false;
  for (auto& w : a.warnings) warned |= w.find("even with every layer recomputed whole") != std::string::npos;
  CHECK(warned);
  const std::string t = a.table();
  CHECK(t.find("DOES NOT FIT") != std::string::npos);
  CHECK(t.find("every step was taken") != std::string::npos);
}

TEST_CASE("pipeline stages choose for themselves") {
  // pp 2, 1F1B: stage 0 holds 2 micro-batches, stage 1 one, so stage 0 needs more.
  const std::vector<std::string> pp{"parallel.dp=1", "parallel.pp=2", "batch.global=8", "batch.micro=2"};
  Plan pnone = plan_of(pp);
  const double lo = pnone.stages[1].total(), hi = pnone.stages[0].total();
  REQUIRE(lo < hi);
  std::vector<std::string> sets = pp;
  sets.push_back("recompute.mode=auto");
  Plan p2 = plan_of(with_memory(sets, 0.5 * (lo + hi)));
  REQUIRE(p2.recompute_auto);
  CHECK(p2.fits);
  REQUIRE_FALSE(p2.recompute_auto->chosen.empty());
  for (auto& c : p2.recompute_auto->chosen) {
    CHECK(c.stage == 0);
    CHECK(c.layer < 2);
  }
  CHECK(p2.stages[1].total() == pnone.stages[1].total());
}

// Recompute modules are one type (ops::Module, ops/module.h) from the schema to the graph node,
// and the rule "attention brings attention_core" is applied one way everywhere.
TEST_CASE("the schema's recompute.modules are the modules a recipe may select, by the names ops spells") {
  std::ifstream in(fs::path(RUNNER_SOURCE_DIR) / "schemas" / "recipe.schema.json");
  const auto schema = nlohmann::json::parse(in);
  std::set<std::string> in_schema, selectable;
  for (const auto& w : schema["properties"]["recompute"]["properties"]["modules"]["items"]["enum"]) in_schema.insert(w);
  for (const auto& [m, word] : enum_names(RecomputeModule{})) {
    CHECK(word == ops::module_name(m));
    CHECK(ops::layer_modules().has(m));  // a layer's module: embed, head and loss are never recomputed
    selectable.insert(std::string(word));
  }
  CHECK(in_schema == selectable);
  CHECK(to_string(ops::Module::residual) == "residual");  // the other modules have names too (no abort)
  // recompute auto's steps are the same modules, plus whole layers.
  Plan a = plan_of({"recompute.mode=auto"});
  REQUIRE(a.recompute_auto);
  std::set<std::string> steps;
  for (const RecomputeModuleCost& m : a.recompute_auto->modules) steps.insert(m.module);
  selectable.insert("layer");
  CHECK(steps == selectable);
}

TEST_CASE("selecting attention recomputes attention_core: in the graph and in the planner's price") {
  using M = ops::Module;
  Plan a = plan_of({"recompute.mode=auto"});
  REQUIRE(a.recompute_auto);
  GptSpec none = a.layout->spec(0);
  none.recompute.assign(4, {});
  const ops::Graph g0 = build_gpt_graph(none);
  const double held0 = static_cast<double>(ops::Executor::simulate(g0).activations_after_forward);
  for (const RecomputeModuleCost& cost : a.recompute_auto->modules) {
    if (cost.module == "layer") continue;
    CAPTURE(cost.module);
    RecomputeConfig rc;
    rc.mode = RecomputeMode::selective;
    rc.modules = {parse_enum<RecomputeModule>(cost.module).value()};
    rc.layers = {0};  // the planner prices its first candidate layer
    GptSpec spec = none;
    spec.recompute = recompute_sets(rc, 4);
    const ops::Graph g = build_gpt_graph(spec);
    // The graph: exactly the layer's nodes of the module, and of attention_core under attention.
    const bool attention = cost.module == "attention";
    double flops = 0;
    for (const ops::Node& n : g.nodes) {
      CAPTURE(n.name);
      const bool expect = n.layer == 0 && (n.module == rc.modules[0] || (attention && n.module == M::attention_core));
      CHECK(n.recompute == expect);
      if (expect) flops += plan_detail::node_flops(g, n);
    }
    // The planner's price of the step is that graph's: its FLOPs and the bytes it frees.
    CHECK(cost.flops == doctest::Approx(flops).epsilon(1e-12));
    const double held = static_cast<double>(ops::Executor::simulate(g).activations_after_forward);
    CHECK(cost.bytes_saved == doctest::Approx(held0 - held).epsilon(1e-12));
  }
  // Mode full recomputes every node of every layer, and nothing outside them.
  RecomputeConfig full;
  full.mode = RecomputeMode::full;
  GptSpec spec = none;
  spec.recompute = recompute_sets(full, 4);
  for (const ops::Node& n : build_gpt_graph(spec).nodes) CHECK(n.recompute == (n.layer >= 0));
}

TEST_CASE("recompute.modules or recompute.layers beside mode auto is a recipe error, where it was written") {
  const std::string text = std::string(kBase) + "recompute:\n  mode: auto\n  layers: [0, 1]\n";
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"recompute.modules=[mlp]"}, "auto chooses the modules itself"},
      {{}, "auto chooses the layers itself"},
  };
  for (const auto& [sets, want] : cases) {
    CAPTURE(want);
    try {
      make_plan(load_recipe_text(text, "t.yaml", sets));
      FAIL("expected an error");
    } catch (const UserError& e) {
      const std::string msg = e.what();
      CHECK(msg.find(want) != std::string::npos);
      CHECK(!e.fix().empty());
      if (sets.empty()) {  // the layers key, in the text
        CHECK(msg.rfind("t.yaml:16:3: ", 0) == 0);
        CHECK(e.loc().line == 16);
        CHECK(e.loc().col == 3);
      } else {  // the override that set modules: its own line, after the text's layers problem
        // (both are reported in one pass)
        CHECK(e.all().size() == 2);
        CHECK(msg.rfind("t.yaml:16:3: ", 0) == 0);
        CHECK(msg.find("\n--set: recompute mode " + want) != std::string::npos);
      }
    }
  }
}

namespace {

using test_support::Result;

Result run(const std::string& args, const std::string& cwd) { return test_support::runner_cmd(args, cwd); }

// A quickstart run under recompute auto (16 heads; and grouped-query attention, 4 key-value
// heads): it recomputes what the plan chose, and the activation peak is the ledger's.
void train_with_auto(const std::vector<std::string>& model_sets) {
  const std::string recipe = std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml";
  std::vector<std::string> base{"train.steps=3",        "train.log_every=1",        "train.eval_every=0",
                                "checkpoint.cadence=never", "checkpoint.every_steps=0", "hardware.memory_gb=1000"};
  base.insert(base.end(), model_sets.begin(), model_sets.end());
  Plan none = make_plan(load_recipe(recipe, base));
  std::vector<std::string> full_sets = base;
  full_sets.push_back("recompute.mode=full");
  Plan full = make_plan(load_recipe(recipe, full_sets));
  const double device = 0.5 * (none.worst_stage().total() + full.worst_stage().total());
  std::vector<std::string> sets = with_memory(base, device);
  sets.push_back("recompute.mode=auto");
  Plan planned = make_plan(load_recipe(recipe, sets));
  REQUIRE(planned.fits);
  REQUIRE_FALSE(planned.recompute_auto->chosen.empty());

  const fs::path cwd = test_support::fresh_dir("recompute_auto", "train");
  std::string args = "train " + recipe + " --quiet --run-dir run";
  for (auto& s : sets) args += " --set " + s;
  Result r = run(args, cwd.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream pj(cwd / "run" / "plan.json");
  const auto plan_json = nlohmann::json::parse(pj);
  REQUIRE(plan_json.contains("recompute"));
  CHECK(plan_json["recompute"]["chosen"].size() == planned.recompute_auto->chosen.size());
  nlohmann::json summary;
  std::ifstream m(cwd / "run" / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("summary")) summary = j;
  }
  REQUIRE(!summary.is_null());
  const double pred = summary["ledger"]["activations"]["predicted"], meas = summary["ledger"]["activations"]["measured"];
  CHECK(pred == doctest::Approx(planned.stages[0].activations));
  CHECK(std::abs(meas - pred) <= 0.05 * pred);
  // And it did recompute: the measured peak is well below what nothing recomputed holds.
  CHECK(meas < none.stages[0].activations - 0.5 * (none.stages[0].activations - planned.stages[0].activations));
  fs::remove_all(cwd);
}

}  // namespace

TEST_CASE("runner train with auto recomputes what the plan chose: activation peak within 5% of the ledger") {
  train_with_auto({});
}

TEST_CASE("runner train with auto and grouped-query attention: the same, the key-value heads' workspace included") {
  train_with_auto({"model.n_kv_heads=4"});
}
