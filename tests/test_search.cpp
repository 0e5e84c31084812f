// The layout search (runner/perf/search.h, `runner plan --search`, `parallel: auto`).
//
// On the layout tests' model (2 layers, 4 heads, 2-digit addition): constraints hold in every
// candidate; the counts add up and the pruned search finds exactly what the exhaustive one
// does; every shown candidate fits its own make_plan; --write reads back as the candidate;
// `parallel: auto` at plan and at train start (one rank, and two under mpirun that agree and
// record the layout); nothing fits exits 2 naming the constraint and a layout that would fit;
// the JSON's shape. A tight hardware.memory_gb (a few MiB) makes memory reject some layouts.
// The ranking's numbers are the cost model's (test_cost_model); nothing here asserts them, only
// that the pruned search (memory-bound micro-batches, grids too big, recompute auto taken over
// from none where none fits) gives exactly what planning every candidate gives.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/perf/search.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

const test_support::TempDir kDir("search");

// The layout recipe with `sections` in place of its batch section.
std::string recipe_with(const std::string& sections) {
  std::string t = test_support::kLayoutRecipe;
  const std::string batch = "batch:\n  global: 8\n  micro: 2\n";
  t.replace(t.find(batch), batch.size(), sections);
  return t;
}

Recipe load(const std::string& sections, const std::vector<std::string>& sets = {}) {
  return load_recipe_text(recipe_with(sections), "search.yaml", sets);
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = kDir.file(name);
  std::ofstream(path) << text;
  return path;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

SearchResult search(const Recipe& r, int64_t world, int top = 1000, bool exhaustive = false) {
  SearchOptions o;
  o.world = world;
  o.top = top;
  o.exhaustive = exhaustive;
  return search_layouts(r, o);
}

bool has(const std::vector<std::string>& v, const std::string& prefix) {
  for (const std::string& s : v)
    if (s.rfind(prefix, 0) == 0) return true;
  return false;
}

// The "layout searched" line of a run log, without its time and rank prefix.
std::string searched_line(const fs::path& log) {
  const std::string t = slurp(log);
  const size_t at = t.find("layout searched");
  return at == std::string::npos ? "" : t.substr(at, t.find(" s per step", at) - at);  // the search's own time differs
}

}  // namespace

TEST_CASE("constraints: every candidate keeps what the recipe fixes, each listed with where it was written") {
  const Recipe r = load("parallel:\n  tp: 2\nbatch:\n  global: 8\n  micro: 2\nrecompute:\n  mode: full\n");
  const SearchResult res = search(r, 4);
  REQUIRE(!res.candidates.empty());
  for (const SearchCandidate& c : res.candidates) {
    CHECK(c.tp == 2);
    CHECK(c.micro == 2);
    CHECK(c.recompute == "full");
    CHECK(c.dp * c.tp * c.pp == 4);
    CHECK(c.micro * c.dp * c.accum == 8);  // the batch equation, global kept
  }
  CHECK(has(res.constraints, "parallel.tp = 2 (search.yaml:"));
  CHECK(has(res.constraints, "batch.micro = 2 (search.yaml:"));
  CHECK(has(res.constraints, "recompute.mode = full (search.yaml:"));
  // Without them the search goes elsewhere: the constraints are what kept it there.
  const SearchResult open = search(load("parallel: auto\nbatch:\n  global: 8\n"), 4);
  bool elsewhere = false;
  for (const SearchCandidate& c : open.candidates) elsewhere |= c.tp != 2 || c.micro != 2 || c.recompute != "full";
  CHECK(elsewhere);
  CHECK(open.world_source == "--world");
}

TEST_CASE("counts add up, the pruned search finds what the exhaustive one does, every candidate fits its plan") {
  const Recipe r = load("parallel: auto\nbatch:\n  global: 16\n", {"hardware.memory_gb=0.0026"});
  const SearchResult pruned = search(r, 2, 100000), all = search(r, 2, 100000, true);
  for (const SearchResult* res : {&pruned, &all}) {
    int64_t rejected = 0;
    for (const auto& [why, n] : res->rejected) rejected += n;
    CHECK(res->searched == res->feasible + rejected);
    CHECK(res->feasible == static_cast<int64_t>(res->candidates.size()));
  }
  CHECK(pruned.rejected.count("memory") == 1);  // the tight memory rejects some
  CHECK(pruned.searched == all.searched);
  CHECK(pruned.rejected == all.rejected);
  REQUIRE(pruned.candidates.size() == all.candidates.size());
  for (size_t i = 0; i < pruned.candidates.size(); ++i) {  // the same layouts, memory and prediction
    CHECK(pruned.candidates[i].describe() == all.candidates[i].describe());
    CHECK(pruned.candidates[i].memory_bytes == all.candidates[i].memory_bytes);
    CHECK(pruned.candidates[i].predicted.step_s == all.candidates[i].predicted.step_s);
  }
  for (size_t i = 1; i < pruned.candidates.size(); ++i)  // best first
    CHECK(pruned.candidates[i - 1].predicted.step_s <= pruned.candidates[i].predicted.step_s);
  for (const SearchCandidate& c : pruned.candidates) {
    const Plan p = make_plan(c.recipe, 2);
    CHECK(p.fits);
    CHECK(p.worst_stage().total() == doctest::Approx(c.memory_bytes));
    CHECK(p.dp == c.dp);
    CHECK(p.tp == c.tp);
    CHECK(p.pp == c.pp);
    CHECK(p.micro == c.micro);
    CHECK(p.accum == c.accum);
  }
}

TEST_CASE("--write: the recipe with the winner reads back and plans exactly the candidate, the user's text kept") {
  const std::string text = recipe_with("parallel: auto\nbatch:\n  global: 16\n") + "# the user's own closing comment\n";
  const Recipe r = load_recipe_text(text, "w.yaml");
  const SearchResult res = search(r, 2, 8);
  for (const SearchCandidate& c : res.candidates) {
    const std::string yaml = write_candidate_yaml(r, c);
    CHECK(yaml.find("# the user's own closing comment") != std::string::npos);
    CHECK(yaml.find("kind: addition") != std::string::npos);
    const Recipe back = load_recipe_text(yaml, "w2.yaml");
    CHECK_FALSE(back.parallel.search);
    const Plan p = make_plan(back, 0), want = make_plan(c.recipe, 2);
    CHECK(p.world == 2);
    CHECK(p.dp == c.dp);
    CHECK(p.tp == c.tp);
    CHECK(p.pp == c.pp);
    CHECK(p.chunks == want.chunks);
    CHECK(p.micro == c.micro);
    CHECK(p.accum == c.accum);
    CHECK(back.parallel.zero == c.zero);
    CHECK(back.parallel.sequence_parallel == c.sequence_parallel);
    CHECK(to_string(back.parallel.schedule) == c.schedule);
    CHECK(p.worst_stage().total() == doctest::Approx(c.memory_bytes));
  }
  // --set overrides are not in the text: the resolved recipe, said so, still the candidate's.
  const Recipe rs = load_recipe_text(text, "w.yaml", {"train.steps=3"});
  const SearchResult rs_res = search(rs, 2, 1);
  const std::string yaml = write_candidate_yaml(rs, rs_res.candidates[0]);
  CHECK(yaml.rfind("# Written by runner plan --search", 0) == 0);
  const Recipe back = load_recipe_text(yaml, "w3.yaml");
  CHECK(back.train.steps == 3);
  CHECK(make_plan(back, 0).dp == rs_res.candidates[0].dp);
}

TEST_CASE("--write on the command line: the file is loadable and plans the layout printed") {
  const std::string in = write("cli.yaml", recipe_with("parallel: auto\nbatch:\n  global: 16\n"));
  const std::string out = kDir.file("cli-best.yaml");
  const test_support::Result r = test_support::runner_cmd("plan " + in + " --search --world 2 --top 2 --json --write " + out);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& best = j["search"]["candidates"][0];
  const Plan p = make_plan(load_recipe(out), 0);
  CHECK(p.dp == best["dp"].get<int64_t>());
  CHECK(p.tp == best["tp"].get<int64_t>());
  CHECK(p.pp == best["pp"].get<int64_t>());
  CHECK(p.micro == best["micro"].get<int64_t>());
  CHECK(p.accum == best["accum"].get<int64_t>());
  CHECK(j["search"]["written"] == out);
}

TEST_CASE("JSON: search.candidates[] with the layout and its prediction; searched, feasible, rejected, seconds") {
  const std::string in = write("json.yaml", recipe_with("parallel: auto\nbatch:\n  global: 16\n"));
  const test_support::Result r = test_support::runner_cmd("plan " + in + " --search --world 2 --top 3 --json");
  REQUIRE(r.code == 0);
  const nlohmann::json s = nlohmann::json::parse(r.out)["search"];
  REQUIRE(s["candidates"].size() == 3);
  for (const char* k : {"dp", "tp", "pp", "virtual_stages", "micro", "accum", "zero", "sequence_parallel", "recompute",
                        "schedule", "memory_bytes", "predicted"})
    CHECK_MESSAGE(s["candidates"][0].contains(k), k);
  for (const char* k : {"step_s", "tokens_per_s", "mfu", "tflops_per_device", "memory_bytes"})
    CHECK_MESSAGE(s["candidates"][0]["predicted"].contains(k), k);
  for (const char* k : {"world", "constraints", "searched", "feasible", "rejected", "seconds", "profile"})
    CHECK_MESSAGE(s.contains(k), k);
  CHECK(s["world"] == 2);
  CHECK(s["constraints"][0].get<std::string>().rfind("batch.global = 16", 0) == 0);
}

TEST_CASE("the world: --world, else the recipe's hardware, else the Slurm allocation") {
  const Recipe r = load("parallel: auto\nbatch:\n  global: 8\n");
  ::setenv("SLURM_NTASKS", "4", 1);
  const SearchResult slurm = search_layouts(r, {});
  ::unsetenv("SLURM_NTASKS");
  CHECK(slurm.world == 4);
  CHECK(slurm.world_source.find("Slurm") != std::string::npos);
  const SearchResult one = search_layouts(r, {});
  CHECK(one.world == 1);
  const SearchResult hw = search_layouts(load("parallel: auto\nbatch:\n  global: 8\n", {"hardware.nodes=2"}), {});
  CHECK(hw.world == 2);
  CHECK(hw.world_source.find("hardware") == 0);
}

TEST_CASE("nothing fits: exit 2 naming the binding constraint, a layout without it, and how many devices") {
  const Recipe r = load("parallel: auto\nbatch:\n  global: 8\n  micro: 8\nrecompute:\n  mode: none\n",
                        {"hardware.memory_gb=0.0022"});
  CHECK_THROWS_AS(search(r, 1), UserError);
  const std::string in = write("nofit.yaml", recipe_with("parallel: auto\nbatch:\n  global: 8\n  micro: 8\nrecompute:\n"
                                                         "  mode: none\n"));
  const test_support::Result res = test_support::runner_cmd("plan " + in + " --search --world 1 --set hardware.memory_gb=0.0022");
  CHECK(res.code == 2);
  CHECK(res.out.find("no layout fits on 1 device") != std::string::npos);
  CHECK(res.out.find("batch.micro = 8 (" + in) != std::string::npos);
  CHECK(res.out.find("without batch.micro = 8") != std::string::npos);  // the nearer layout
  CHECK(res.out.find(" devices: dp ") != std::string::npos);            // or more devices
}

TEST_CASE("no batch size at all: the search says to set batch.global instead of searching nothing") {
  const Recipe r = load("parallel: auto\n");
  try {
    search(r, 2);
    FAIL("searched a recipe without a batch size");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("set batch.global") != std::string::npos);
  }
}

TEST_CASE("parallel: auto reads as parallel.auto, and runner plan searches it and plans the winner") {
  const Recipe r = load("parallel: auto\nbatch:\n  global: 8\n");
  CHECK(r.parallel.search);
  CHECK(r.locs.count("parallel.auto") == 1);
  CHECK(load("batch:\n  global: 8\n", {"parallel=auto"}).parallel.search);
  CHECK_FALSE(load("batch:\n  global: 8\n").parallel.search);
  const std::string in = write("plan-auto.yaml", recipe_with("parallel: auto\nbatch:\n  global: 8\n"));
  const test_support::Result res = test_support::runner_cmd("plan " + in + " --world 2");
  CHECK(res.code == 0);
  CHECK(res.out.find("layout searched (parallel: auto)") != std::string::npos);
  CHECK(res.out.find("on 2 devices (--world)") != std::string::npos);
}

TEST_CASE("parallel: auto at train start: searched on every rank alike, logged, recorded in the run directory") {
  const std::string in = write("train-auto.yaml", recipe_with("parallel: auto\nbatch:\n  global: 8\n"));
  for (int np : {1, 2}) {
    CAPTURE(np);
    const fs::path dir = kDir / ("run" + std::to_string(np));
    const test_support::Result res = test_support::sh(test_support::launcher(np == 1 ? 0 : np) + test_support::binary() + " train " +
                                                      in + " --quiet --run-dir " + dir.string() + " --set train.steps=2");
    REQUIRE_MESSAGE(res.code == 0, res.out);
    const nlohmann::json s = nlohmann::json::parse(slurp(dir / "search.json"))["search"];
    CHECK(s["world"] == (np == 1 ? 1 : 2));
    const Recipe stored = load_recipe((dir / "recipe.yaml").string());
    CHECK_FALSE(stored.parallel.search);  // resume and status see a fixed layout
    const Plan p = make_plan(stored, 0);
    CHECK(p.world == np);
    CHECK(p.dp == s["candidates"][0]["dp"].get<int64_t>());
    CHECK(p.tp == s["candidates"][0]["tp"].get<int64_t>());
    CHECK(p.micro == s["candidates"][0]["micro"].get<int64_t>());
    const std::string line0 = searched_line(dir / "log.rank0.txt");
    CHECK(line0.find("dp " + std::to_string(p.dp) + " x tp " + std::to_string(p.tp)) != std::string::npos);
    if (np == 2) CHECK(searched_line(dir / "log.rank1.txt") == line0);  // both ranks chose the same
  }
}

// ---- The bound (search.cpp, Bound): candidates whose lower bound on the step is above the top
// K's slowest are skipped unplanned. It holds only if it never exceeds the cost model's
// prediction; then the bounded search returns exactly the exhaustive top K.

namespace {

// A published recipe (bench/published/) with its layout left to the search, as
// bench/search_published.py's free search: every layout field but batch.global unconstrained.
Recipe published_free(const std::string& name, const std::vector<std::string>& sets) {
  const std::string path = std::string(RUNNER_SOURCE_DIR) + "/bench/published/" + name + ".yaml";
  std::string text = slurp(path);
  if (const size_t at = text.find("\n  stage_layers:"); at != std::string::npos)  // the search splits evenly
    text.erase(at, text.find('\n', at + 1) - at);
  Recipe r = load_recipe_text(text, path, sets);
  for (auto it = r.locs.begin(); it != r.locs.end();) {
    const std::string& k = it->first;
    const bool layout = k.rfind("parallel.", 0) == 0 || k.rfind("recompute.", 0) == 0 || k == "batch.micro" ||
                        k == "batch.accum";
    it = layout ? r.locs.erase(it) : std::next(it);
  }
  r.parallel.stage_layers.clear();
  r.recompute.layers.clear();
  return r;
}

// The layout recipe on GPUs: a100-80gb nodes of `per_node` devices of `memory_gb`.
Recipe gpu_layout(int64_t nodes, int64_t per_node, const std::string& memory_gb) {
  return load("parallel: auto\nbatch:\n  global: 32\n",
              {"hardware.device=a100-80gb", "hardware.nodes=" + std::to_string(nodes),
               "hardware.devices_per_node=" + std::to_string(per_node), "hardware.memory_gb=" + memory_gb});
}

void same_top(const Recipe& r, int top) {
  SearchOptions o;
  o.top = top;
  const SearchResult bounded = search_layouts(r, o);
  o.exhaustive = true;
  const SearchResult all = search_layouts(r, o);
  CHECK(all.bounded == 0);
  CHECK(bounded.bounded > 0);  // the bound skipped something: this checks it, not a search without it
  CHECK(bounded.searched == all.searched);
  int64_t rejected = 0;
  for (const auto& [why, n] : bounded.rejected) rejected += n;
  CHECK(bounded.searched == bounded.feasible + rejected + bounded.bounded);
  REQUIRE(bounded.candidates.size() == all.candidates.size());
  for (size_t i = 0; i < all.candidates.size(); ++i) {  // the same layouts, predictions and order
    CAPTURE(i);
    CHECK(bounded.candidates[i].describe() == all.candidates[i].describe());
    CHECK(bounded.candidates[i].predicted.step_s == all.candidates[i].predicted.step_s);
    CHECK(bounded.candidates[i].memory_bytes == all.candidates[i].memory_bytes);
  }
  const nlohmann::json j = bounded.to_json();
  CHECK(j["search"]["skipped_by_bound"] == bounded.bounded);
  CHECK(bounded.table().find(std::to_string(bounded.bounded) + " unplanned") != std::string::npos);
}

void bound_below(const Recipe& r) {
  SearchOptions o;
  const std::vector<BoundCheck> all = search_bound_check(r, o);
  REQUIRE(all.size() > 10);
  int tight = 0;
  for (const BoundCheck& b : all) {
    CAPTURE(b.layout);
    CHECK(b.formula > 0);
    CHECK(b.formula * (1 - 1e-9) <= b.predicted);  // the search's margin for rounding
    CHECK(b.learnt * (1 - 1e-9) <= b.predicted);
    CHECK(b.learnt >= b.formula);  // a plan's layers hold at least their GEMMs and attention
    tight += b.learnt > 0.5 * b.predicted;
  }
  CHECK(tight > static_cast<int>(all.size()) / 2);  // a bound of 0 would hold too: it is near
}

}  // namespace

TEST_CASE("the bound never exceeds the cost model's prediction, over every candidate that fits") {
  SUBCASE("the layout model on 2 nodes of 4 GPUs") { bound_below(gpu_layout(2, 4, "80")); }
  SUBCASE("Megatron 1.7B (A100) on 16 GPUs") { bound_below(published_free("megatron-a100-1.7b", {"hardware.nodes=2"})); }
  SUBCASE("Llama 3 (grouped-query attention, SwiGLU, RoPE), 8 of its layers on 16 H100s") {
    bound_below(published_free("llama3-405b-h100-8192", {"hardware.nodes=2", "model.n_layers=8", "batch.global=64"}));
  }
}

TEST_CASE("the bounded search returns exactly the exhaustive top K: layouts, predicted times, order") {
  SUBCASE("the layout model on 2 nodes of 4 GPUs") { same_top(gpu_layout(2, 4, "80"), 20); }
  SUBCASE("Megatron 1.7B (A100) on 16 GPUs") { same_top(published_free("megatron-a100-1.7b", {"hardware.nodes=2"}), 10); }
  SUBCASE("Megatron 1T (A100), 16 of its 128 layers on 64 GPUs") {
    same_top(published_free("megatron-a100-1t", {"hardware.nodes=8", "model.n_layers=16", "batch.global=256"}), 5);
  }
  SUBCASE("Megatron 76B (A100) on its 1,024 GPUs, top 1 as parallel: auto asks") {
    same_top(published_free("megatron-a100-76b", {}), 1);
  }
}

TEST_CASE("tp stays inside a node unless the recipe fixes it") {
  const auto tps = [](const Recipe& r) {
    SearchOptions o;
    o.top = 100000;
    std::set<int64_t> out;
    for (const SearchCandidate& c : search_layouts(r, o).candidates) out.insert(c.tp);
    return out;
  };
  CHECK(tps(gpu_layout(4, 2, "80")) == std::set<int64_t>{1, 2});     // 4 heads allow tp 4: 2 per node cap it
  CHECK(tps(gpu_layout(2, 4, "80")) == std::set<int64_t>{1, 2, 4});  // 4 per node: tp 4 is searched
  Recipe fixed = load("parallel:\n  tp: 4\nbatch:\n  global: 32\n",
                      {"hardware.device=a100-80gb", "hardware.nodes=4", "hardware.devices_per_node=2"});
  CHECK(tps(fixed) == std::set<int64_t>{4});  // the recipe asks: across nodes
}
