// `runner generate` and `runner export` on the strict CPU device (ops/strict/): the
// model's weights copied in, the KV cache in device memory, the logits out row by row, export
// staging every weight out. The strict device runs the CPU's kernels behind a GPU's rules, so
// everything it produces must be the plain CPU's bits: the same tokens, the same logits (the
// --logits-out file byte for byte), the same exported files. And a GPU device kind on a
// machine without a GPU exits 2 before anything runs, as `runner train` does.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ops/knobs.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"

namespace fs = std::filesystem;

namespace {

using test_support::runner_split;
using Result = test_support::SplitResult;

const test_support::TinyQuickstartRun& gpt() { return test_support::tiny_quickstart("gen_strict_gpt", 20, "3e-3"); }
const test_support::TinyQuickstartRun& llama() {
  return test_support::tiny_quickstart("gen_strict_llama", 20, "3e-3",
                                       std::string(test_support::kLlamaSets) + " model.n_heads=2 model.n_kv_heads=1");
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// The --stats line of a generate run's stderr.
nlohmann::json stats_of(const std::string& err) {
  std::istringstream lines(err);
  for (std::string l; std::getline(lines, l);)
    if (!l.empty() && l[0] == '{') return nlohmann::json::parse(l);
  return {};
}

}  // namespace

TEST_CASE("generate on cpu-strict: the cpu's tokens and logits, bit for bit (cache formats, sampling, no cache)") {
  const std::vector<std::string> configs = {
      "--set inference.batch=3",                                    // fp32 KV cache
      "--set inference.batch=3 inference.kv_dtype=int8",             // int8 codes and scales
      "--temperature 0.9 --top-k 20 --top-p 0.95 --seed 4 --set inference.batch=3 inference.kv_dtype=bf16",
      "--no-kv-cache",                                               // full forward passes
  };
  for (const bool is_llama : {false, true}) {
    const auto& f = is_llama ? llama() : gpt();
    std::ofstream(f.dir / "prompts.txt") << "12+34=\n7+8=\n100+900=\n";
    for (const std::string& cfg : configs) {
      CAPTURE(is_llama);
      CAPTURE(cfg);
      std::string out[2], logits[2];
      for (int strict = 0; strict < 2; ++strict) {
        const fs::path lp = f.dir / (strict ? "strict.f32" : "cpu.f32");
        // hardware.device in the same --set as the rest (one --set: the last one wins with CLI11's take_all too)
        std::string args = "generate " + f.run.string() + " --prompts " + (f.dir / "prompts.txt").string() +
                           " --json --stats --max-new-tokens 7 --logits-out " + lp.string() + " " + cfg;
        args += cfg.find("--set") != std::string::npos ? " hardware.device=" : " --set hardware.device=";
        args += strict ? "cpu-strict" : "cpu";
        const Result r = runner_split(args, f.dir);
        INFO(r.err);
        REQUIRE(r.code == 0);
        CHECK(stats_of(r.err)["device"] == (strict ? "cpu-strict" : "cpu"));
        out[strict] = r.out;
        logits[strict] = file_bytes(lp);
      }
      CHECK(out[1] == out[0]);  // tokens, completions, finish reasons
      CHECK(logits[0].size() == 3 * 7 * 256 * sizeof(float));
      CHECK(logits[1] == logits[0]);
    }
  }
}

TEST_CASE("export on cpu-strict: every file the cpu writes, byte for byte") {
  const auto& f = llama();  // split q/k/v and gate/up: each fused weight staged out once, cut three ways
  for (const std::string fmt : {"safetensors", "npz"}) {
    CAPTURE(fmt);
    for (const char* dev : {"cpu", "cpu-strict"}) {
      const Result r = runner_split("export " + f.run.string() + " --format " + fmt + " --out " +
                                    (f.dir / ("export_" + fmt + "_" + dev)).string() + " --set hardware.device=" + dev, f.dir);
      INFO(r.err);
      REQUIRE(r.code == 0);
    }
    const fs::path a = f.dir / ("export_" + fmt + "_cpu"), b = f.dir / ("export_" + fmt + "_cpu-strict");
    int files = 0;
    for (const fs::directory_entry& e : fs::directory_iterator(a)) {
      CAPTURE(e.path().filename().string());
      CHECK(file_bytes(e.path()) == file_bytes(b / e.path().filename()));
      ++files;
    }
    CHECK(files >= 2);
  }
}

TEST_CASE("generate and export of a GPU recipe without a GPU exit 2 before anything runs") {
  if (ops::knobs().expect_gpu) {
    MESSAGE("RUNNER_EXPECT_GPU is set: this machine has a GPU, the no-GPU path is not checked here");
    return;
  }
  const auto& f = gpt();
  for (const char* dev : {"cuda", "h100-80gb"}) {
    CAPTURE(dev);
    const Result g = runner_split("generate " + f.run.string() + " --prompt '1+2=' --set hardware.device=" + dev, f.dir);
    CHECK(g.code == 2);
    CHECK(g.out.empty());
    CHECK(g.err.find("hardware.device") != std::string::npos);
    CHECK(g.err.find("hardware.device=cpu") != std::string::npos);  // the fix
    CHECK(g.err.find("terminate called") == std::string::npos);
    const fs::path out = f.dir / (std::string("gpu_export_") + dev);
    const Result e = runner_split("export " + f.run.string() + " --out " + out.string() + " --set hardware.device=" + dev, f.dir);
    CHECK(e.code == 2);
    CHECK(e.err.find("hardware.device") != std::string::npos);
    CHECK(!fs::exists(out));  // nothing written
  }
}
