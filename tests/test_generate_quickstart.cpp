// A soak (its own .ci/run step; scripts/test.sh leaves it out): the quickstart model, trained
// in full, completes the held-out addition problems through `runner generate` with the accuracy
// its trainer reported (the same greedy choice on the same checkpoint), above 90%.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/data/data.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

TEST_CASE("generate: the quickstart model completes held-out additions with the trainer's accuracy") {
  const test_support::TempDir dir("generate_qs");
  const std::string run = (dir / "run").string();
  const test_support::Result trained =
      test_support::runner_cmd("train " + test_support::quickstart_recipe() + " --quiet --run-dir " + run);
  INFO(trained.out);
  REQUIRE(trained.code == 0);
  double trainer_acc = -1;
  std::ifstream mf(fs::path(run) / "metrics.jsonl");
  for (std::string l; std::getline(mf, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("eval")) trainer_acc = j["accuracy"];
  }
  REQUIRE(trainer_acc >= 0);
  // The trainer's held-out problems: 256 of them, from train.seed (1234 in the quickstart).
  auto problems = runner::addition_eval_problems(3, 256, 1234);
  std::ofstream pf(dir / "prompts.txt");
  for (auto& p : problems) pf << runner::byte_detokenize(p.prompt) << "\n";
  pf.close();
  // The stop string is a newline, written inside single quotes (sh has no $'...' quoting).
  const test_support::SplitResult gen = test_support::runner_split(
      "generate " + run + " --prompts " + (dir / "prompts.txt").string() + " --json --max-new-tokens 5 --stop '\n'", dir);
  INFO(gen.err);
  REQUIRE(gen.code == 0);
  std::istringstream lines(gen.out);
  int64_t correct = 0, seen = 0;
  for (std::string l; std::getline(lines, l); ++seen) {
    auto j = nlohmann::json::parse(l);
    const size_t i = j["index"];
    std::vector<int32_t> toks = j["tokens"].get<std::vector<int32_t>>();
    correct += toks == problems[i].answer;
  }
  REQUIRE(seen == 256);
  const double acc = static_cast<double>(correct) / 256.0;
  MESSAGE("runner generate: " << correct << "/256 = " << acc << "; the trainer reported " << trainer_acc);
  CHECK(acc >= 0.9);
  CHECK(std::abs(acc - trainer_acc) <= 1.0 / 256 + 1e-12);  // one near-tie between GEMM shapes at most
  fs::remove_all(dir);
}
