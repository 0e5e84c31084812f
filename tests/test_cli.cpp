// The command line end to end: exit codes, error format, nothing written on bad input,
// and a short training run that leaves the run directory docs/architecture.md describes.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;

namespace {

using test_support::Result;

Result run(const std::string& args, const std::string& cwd = "") { return test_support::runner_cmd(args, cwd); }

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("cli", name); }

std::string first_line(const fs::path& f) {
  std::ifstream in(f);
  std::string l;
  std::getline(in, l);
  return l;
}

const std::string kRecipes = std::string(RUNNER_SOURCE_DIR) + "/recipes/";

// `runner train` of recipes/quickstart.yaml with `args`, in `cwd`.
Result train_quickstart(const fs::path& cwd, const std::string& args) {
  return run("train " + kRecipes + "quickstart.yaml " + args, cwd.string());
}

}  // namespace

TEST_CASE("runner plan prints the table for every shipped recipe, quickly") {
  for (const char* name : {"quickstart", "quickstart-llama", "gpt2-124m", "llama-7b-8xh100", "llama-70b-64gpu", "does-not-fit"}) {
    CAPTURE(name);
    auto t0 = std::chrono::steady_clock::now();
    // Their data files are placeholders: planned without reading them (test_plan_gate checks that part).
    Result r = run("plan " + kRecipes + name + ".yaml --no-data-check");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(r.code == (std::string(name) == "does-not-fit" ? 2 : 0));  // plan gates on fit
    CHECK(r.out.find("memory per rank") != std::string::npos);
    CHECK(r.out.find("verdict") != std::string::npos);
    CHECK(s < 5.0);  // generous bound for a loaded CI machine; measured ~0.05 s (0.5 s for does-not-fit)
  }
  Result j = run("plan " + kRecipes + "quickstart.yaml --json");
  REQUIRE(j.code == 0);
  auto js = nlohmann::json::parse(j.out);
  CHECK(js["fits"] == true);
  CHECK(js["batch"]["global"].get<int64_t>() > 0);
}

TEST_CASE("every bad recipe exits 2 with file:line:col and writes nothing") {
  fs::path dir = fs::path(RUNNER_TEST_DIR) / "bad_recipes";
  int n = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    CAPTURE(e.path().filename().string());
    std::string expect = first_line(e.path());
    REQUIRE(expect.rfind("# expect: ", 0) == 0);
    std::string loc = expect.substr(10, expect.find(": ", 10) - 10);  // "line:col"
    fs::path cwd = temp_dir("bad");
    for (const char* cmd : {"plan", "train"}) {
      Result r = run(std::string(cmd) + " " + e.path().string(), cwd.string());
      CHECK(r.code == 2);
      CHECK(r.out.rfind(e.path().string() + ":" + loc + ": ", 0) == 0);
      CHECK(r.out.find("terminate called") == std::string::npos);
      CHECK(r.out.find("what():") == std::string::npos);
      CHECK(fs::is_empty(cwd));  // no run directory, no partial output
    }
    fs::remove_all(cwd);
    ++n;
  }
  CHECK(n >= 25);
}

TEST_CASE("bad command lines and missing files exit 2") {
  CHECK(run("plan /nonexistent/recipe.yaml").code == 2);
  CHECK(run("plan").code == 2);
  CHECK(run("frobnicate").code == 2);
  Result r = run("plan " + kRecipes + "quickstart.yaml --set batch.micro=eight");
  CHECK(r.code == 2);
  CHECK(r.out.find("batch.micro") != std::string::npos);
}

TEST_CASE("a layout of several ranks in one process started by hand: launch it with mpirun -np N") {
  const fs::path cwd = temp_dir("unlaunched");
  for (const auto& [set, ranks] : std::vector<std::pair<std::string, int>>{{"parallel.tp=2", 2}, {"parallel.pp=2", 2},
                                                                          {"parallel.dp=2 --set parallel.tp=2", 4}}) {
    CAPTURE(set);
    const Result r = run("train " + kRecipes + "quickstart.yaml --run-dir " + (cwd / "run").string() + " --set " + set);
    CHECK(r.code == 2);
    CHECK(r.out.find("mpirun -np " + std::to_string(ranks)) != std::string::npos);
    CHECK(r.out.find("devices_per_node") == std::string::npos);
    CHECK(r.out.find("set parallel.dp explicitly") == std::string::npos);
    CHECK_FALSE(fs::exists(cwd / "run"));
  }
}

TEST_CASE("train refuses a missing data file before writing anything") {
  fs::path cwd = temp_dir("nodata");
  Result r = run("train " + kRecipes + "quickstart.yaml --set data.kind=text --set data.path=missing.txt", cwd.string());
  CHECK(r.code == 2);
  CHECK(r.out.find("missing.txt") != std::string::npos);
  CHECK(fs::is_empty(cwd));
  fs::remove_all(cwd);
}

TEST_CASE("a bad RUNNER_GEMM_PATH is refused with exit code 2 before anything is written") {
  fs::path cwd = temp_dir("gemm_env");
  for (const char* cmd : {"train", "plan"}) {
    CAPTURE(cmd);
    setenv("RUNNER_GEMM_PATH", "fastest", 1);
    Result r = run(std::string(cmd) + " " + kRecipes + "quickstart.yaml --set precision.compute=bf16", cwd.string());
    unsetenv("RUNNER_GEMM_PATH");
    CHECK(r.code == 2);
    CHECK(r.out.find("RUNNER_GEMM_PATH") != std::string::npos);
    CHECK(r.out.find("auto, onednn or sgemm") != std::string::npos);
    CHECK(fs::is_empty(cwd));
  }
  fs::remove_all(cwd);
}

TEST_CASE("a bf16 run says which GEMM path each 16-bit dtype takes, and records it in the run directory") {
  fs::path cwd = temp_dir("bf16");
  Result r = run("train " + kRecipes + "quickstart.yaml --set precision.compute=bf16 --set train.steps=3 --set train.eval_every=0 --run-dir run",
                 cwd.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("precision  bf16 weights and activations | fp32 master weights") != std::string::npos);
  CHECK(r.out.find("GEMM       bf16: ") != std::string::npos);
  auto j = nlohmann::json::parse(std::ifstream(cwd / "run" / "gemm_paths.json"));
  REQUIRE(j.contains("bf16"));
  const std::string path = j["bf16"]["path"];
  CHECK((path == "onednn-bf16" || path == "fp32-sgemm"));
  CHECK(r.out.find("bf16: " + path) != std::string::npos);
  fs::remove_all(cwd);
}

TEST_CASE("a short training run leaves the run directory and learns") {
  fs::path cwd = temp_dir("train");
  Result r = train_quickstart(cwd, "--set train.steps=60 --set train.log_every=20 --set train.eval_every=0 --run-dir run");
  INFO(r.out);
  REQUIRE(r.code == 0);
  fs::path run_dir = cwd / "run";
  CHECK(fs::exists(run_dir / "recipe.yaml"));
  CHECK(fs::exists(run_dir / "plan.json"));
  CHECK(fs::exists(run_dir / "log.rank0.txt"));
  CHECK(r.out.find("step 20/60 | loss") != std::string::npos);
  CHECK(r.out.find("tok/s") != std::string::npos);
  CHECK(r.out.find("ETA") != std::string::npos);
  std::ifstream m(run_dir / "metrics.jsonl");
  std::vector<double> losses;
  nlohmann::json summary;
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("summary")) summary = j;
    else if (!j.contains("eval") && !j.contains("monitor") && !j.contains("alert")) {
      losses.push_back(j["loss"].get<double>());
      for (const char* k : {"lr", "grad_norm", "tokens_per_s", "mfu", "step_ms", "data_ms", "peak_bytes"})
        CHECK_MESSAGE(j.contains(k), k);
    }
  }
  REQUIRE(losses.size() == 60);
  CHECK(losses.back() < 0.6 * losses.front());
  REQUIRE(!summary.is_null());
  // Ledger honesty on a real run: each account within 5% of the plan.
  for (auto& [name, v] : summary["ledger"].items()) {
    CAPTURE(name);
    double pred = v["predicted"], meas = v["measured"];
    CHECK(std::abs(meas - pred) <= 0.05 * pred + 1024);
  }
  // The resolved recipe in the run directory plans to the same numbers.
  Result again = run("plan " + (run_dir / "recipe.yaml").string() + " --json");
  CHECK(again.code == 0);
  fs::remove_all(cwd);
}

TEST_CASE("data prepare turns a text file into an HDF5 token dataset that trains") {
  fs::path cwd = temp_dir("prepare");
  {
    std::ofstream t(cwd / "corpus.txt");
    for (int i = 0; i < 400; ++i) t << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  Result p = test_support::runner_ok("data prepare corpus.txt corpus.h5", cwd.string());
  CHECK(p.out.find("wrote") != std::string::npos);
  REQUIRE(fs::exists(cwd / "corpus.h5"));
  Result t = train_quickstart(cwd, "--quiet --set data.kind=hdf5 --set data.path=corpus.h5 --set train.steps=5 "
                                   "--set checkpoint.every_steps=5 --run-dir run");
  INFO(t.out);
  CHECK(t.code == 0);
  CHECK(fs::exists(cwd / "run" / "checkpoints" / "step_00000005.h5"));
  Result missing = run("data prepare nothing.txt out.h5", cwd.string());
  CHECK(missing.code == 2);
  CHECK(missing.out.find("nothing.txt") != std::string::npos);
  CHECK_FALSE(fs::exists(cwd / "out.h5"));
  fs::remove_all(cwd);
}

TEST_CASE("inspect reports a checkpoint, and exits 2 on garbage") {
  fs::path cwd = temp_dir("inspect");
  Result t = run("train " + kRecipes + "quickstart.yaml --quiet --set train.steps=3 --set checkpoint.every_steps=3 --run-dir run",
                 cwd.string());
  REQUIRE(t.code == 0);
  Result i = run("inspect run/checkpoints/step_00000003.h5", cwd.string());
  CHECK(i.code == 0);
  CHECK(i.out.find("step 3") != std::string::npos);
  CHECK(i.out.find("/params/wte") != std::string::npos);
  {
    std::ofstream g(cwd / "step_00000009.h5");
    g << "not hdf5 at all";
  }
  Result bad = run("inspect step_00000009.h5", cwd.string());
  CHECK(bad.code == 2);
  fs::remove_all(cwd);
}
