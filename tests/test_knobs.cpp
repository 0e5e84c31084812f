// The RUNNER_* knobs (ops/knobs.h): typed, parsed strictly (a malformed value is an error that
// names the variable), an empty value is unset, and docs/knobs.md lists every one read.
#include <doctest/doctest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>

#include "ops/knobs.h"
#include "tests/support/env.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace {

// A fake environment for read_knobs.
std::map<std::string, std::string> g_env;
const char* lookup(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
ops::Knobs read(std::map<std::string, std::string> env) {
  g_env = std::move(env);
  return ops::read_knobs(lookup);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("knobs: defaults without the variables") {
  const ops::Knobs k = read({});
  CHECK(k.gemm_path.empty());
  CHECK(k.native16);
  CHECK_FALSE(k.strict);
  CHECK_FALSE(k.host_staged_comm);
  CHECK_FALSE(k.strict_arena_gib);
  CHECK_FALSE(k.faults.any_step_fault());
  CHECK_FALSE(k.faults.ckpt_after_bytes);
  CHECK_FALSE(k.faults.ckpt_exit);
  CHECK_FALSE(k.expect_gpu);
}

TEST_CASE("knobs: typed values; an empty value is unset") {
  const ops::Knobs k = read({{"RUNNER_STRICT", "1"}, {"RUNNER_NATIVE16", "0"}, {"RUNNER_STRICT_ARENA_GIB", "1.5"},
                             {"RUNNER_FAULT_FAIL_RANK", "1"}, {"RUNNER_FAULT_FAIL_STEP", "-7"},
                             {"RUNNER_CKPT_FAULT_EXIT", "true"}, {"RUNNER_GEMM_PATH", "sgemm"},
                             {"RUNNER_DEBUG_DATA_DELAY_MS", ""}});
  CHECK(k.strict);
  CHECK_FALSE(k.native16);
  CHECK(k.strict_arena_gib == 1.5);
  CHECK(k.faults.fail_rank == 1);
  CHECK(k.faults.fail_step == -7);
  CHECK(k.faults.any_step_fault());
  CHECK(k.faults.ckpt_exit);
  CHECK(k.gemm_path == "sgemm");
  CHECK_FALSE(k.faults.data_delay_ms);
}

TEST_CASE("knobs: a malformed value is an error naming the variable and the value") {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"RUNNER_FAULT_NAN_STEP", "3x"},
                                                                      {"RUNNER_DEBUG_STALL_MS", "fast"},
                                                                      {"RUNNER_STRICT", "2"},
                                                                      {"RUNNER_STRICT_ARENA_GIB", "lots"}}) {
    CAPTURE(name);
    try {
      read({{name, value}});
      FAIL("accepted " << name << "=" << value);
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(name + "=" + value) != std::string::npos);
    }
  }
}

TEST_CASE("knobs: read once; ScopedEnv re-reads them for its scope and restores them after") {
  const bool before = ops::knobs().faults.nan_step.has_value();
  {
    test_support::ScopedEnv nan("RUNNER_FAULT_NAN_STEP", "5");
    CHECK(ops::knobs().faults.nan_step == 5);
  }
  CHECK(ops::knobs().faults.nan_step.has_value() == before);
  CHECK_THROWS_AS(test_support::ScopedEnv("RUNNER_FAULT_NAN_STEP", "five"), std::invalid_argument);
  CHECK(ops::knobs().faults.nan_step.has_value() == before);  // the malformed value did not stay
}

TEST_CASE("docs/knobs.md lists every knob ops/knobs.cpp reads") {
  const std::string src = slurp(std::string(RUNNER_SOURCE_DIR) + "/ops/knobs.cpp");
  const std::string doc = slurp(std::string(RUNNER_SOURCE_DIR) + "/docs/knobs.md");
  const std::regex name("\"(RUNNER_[A-Z0-9_]+)\"");
  std::set<std::string> read_names;
  for (auto it = std::sregex_iterator(src.begin(), src.end(), name); it != std::sregex_iterator(); ++it)
    read_names.insert((*it)[1]);
  CHECK(read_names.size() >= 30);
  for (const std::string& n : read_names) {
    CAPTURE(n);
    CHECK(doc.find("`" + n + "`") != std::string::npos);
  }
}
