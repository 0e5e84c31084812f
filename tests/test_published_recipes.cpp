// The published large runs beside the search (bench/published/, bench/search_published.py, the
// table in docs/search.md "At scale, against published measurements"): the comparison is only
// worth something if each recipe is the run the source measured. So every recipe loads, its
// `# published:` line parses, its world is the published GPU count and its layout multiplies to
// it, and its model has the published parameter count (to the digits the source gives), which
// pins the shape: layers, width, heads, vocabulary, tied or untied embeddings, the MLP width.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

using namespace runner;

namespace {

nlohmann::json published_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  const std::string tag = "# published: {";
  while (std::getline(f, line))
    if (line.rfind(tag, 0) == 0) return nlohmann::json::parse(line.substr(tag.size() - 1));
  return nullptr;
}

// Half a unit of the last digit the source gives ("145.6" -> 0.05e9): the published count
// rounded, so ours must round to it. "~70": a model-size label, not a count (Megatron-Core's
// table names its models 1.7B ... 462B): within 5% (untied embeddings: 1.75B for "1.7B"; tied would be 1.49B).
double tolerance(const std::string& billions) {
  if (billions[0] == '~') return 0.05 * std::stod(billions.substr(1)) * 1e9;
  const auto dot = billions.find('.');
  const int digits = dot == std::string::npos ? 0 : static_cast<int>(billions.size() - dot - 1);
  return 0.5 * std::pow(10.0, -digits) * 1e9;
}

}  // namespace

TEST_CASE("every published-run recipe is the run its source measured: world, layout and parameter count") {
  const std::string dir = std::string(RUNNER_SOURCE_DIR) + "/bench/published";
  int recipes = 0, a100 = 0, h100 = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    const std::string path = e.path().string();
    CAPTURE(path);
    const nlohmann::json pub = published_line(path);
    REQUIRE(pub.is_object());
    REQUIRE(pub.contains("value"));
    CHECK(pub["value"].get<double>() > 0);
    CHECK((pub["metric"] == "step_s" || pub.contains("formula")));
    Recipe r = load_recipe(path);
    if (r.batch.micro == 0) r = load_recipe(path, {"batch.micro=1"});  // not published: any micro to plan
    const int64_t gpus = pub["gpus"].get<int64_t>();
    CHECK(r.hardware.nodes * r.hardware.devices_per_node == gpus);
    const Plan p = make_plan(r);
    CHECK(p.dp * p.tp * p.pp == gpus);
    const std::string billions = pub["params_b"].get<std::string>();
    CHECK(std::abs(static_cast<double>(p.param_count) - std::stod(billions.substr(billions[0] == '~')) * 1e9) <= tolerance(billions));
    ++recipes;
    a100 += r.hardware.device.rfind("a100", 0) == 0;
    h100 += r.hardware.device.rfind("h100", 0) == 0;
  }
  // The issue asks for at least 8 runs, on A100 and on H100, at several scales.
  CHECK(recipes >= 8);
  CHECK(a100 >= 3);
  CHECK(h100 >= 3);
}
