// `runner plan` as a gate for a job script: it refuses what `train` would refuse,
// with the same message (a missing data file, text data pointed at an HDF5 or token file, a
// token beyond the vocabulary), exits 2 on a recipe that does not fit after printing the plan
// and what would fit (each with the batch equation it implies), reports every recipe mistake
// in one pass; and `runner data prepare` refuses a binary file unless --binary-ok.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace fs = std::filesystem;
using test_support::Result;

namespace {

const std::string kQuick = std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml";
const std::string kFixtures = std::string(RUNNER_TEST_DIR) + "/fixtures/";

Result run(const std::string& args, const std::string& cwd = "") { return test_support::runner_cmd(args, cwd); }

void write(const fs::path& f, const std::string& bytes) {
  std::ofstream o(f, std::ios::binary);
  o << bytes;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// The line of `out` that holds `what` (empty when none does).
std::string line_with(const std::string& out, const std::string& what) {
  const size_t at = out.find(what);
  if (at == std::string::npos) return "";
  const size_t begin = out.rfind('\n', at) == std::string::npos ? 0 : out.rfind('\n', at) + 1;
  return out.substr(begin, out.find('\n', at) - begin);
}

// plan and train of the quickstart with `sets` in a fresh directory: both exit 2 with the same
// message (the data problem), plan after printing its plan, and neither writes anything.
std::string same_refusal(const std::string& sets, const std::string& expect) {
  const fs::path cwd = test_support::fresh_dir("plan_gate", "refusal");
  const Result plan = run("plan " + kQuick + " " + sets, cwd.string());
  const Result train = run("train " + kQuick + " " + sets, cwd.string());
  INFO("plan: " << plan.out);
  INFO("train: " << train.out);
  CHECK(plan.code == 2);
  CHECK(train.code == 2);
  const std::string message = line_with(plan.out, expect);
  CHECK_FALSE(message.empty());
  CHECK(message == line_with(train.out, expect));
  CHECK(plan.out.find("memory per rank") < plan.out.find(message));  // the plan, then the refusal
  CHECK(plan.out.find("--no-data-check") != std::string::npos);
  CHECK(fs::is_empty(cwd));
  // Planned where the data is not: the check can be skipped, the plan stands.
  CHECK(run("plan " + kQuick + " " + sets + " --no-data-check", cwd.string()).code == 0);
  fs::remove_all(cwd);
  return message;
}

}  // namespace

TEST_CASE("plan checks the data train will read, with train's own message") {
  const fs::path dir = test_support::fresh_dir("plan_gate", "data");
  const std::string text = " --set data.kind=text --set data.path=";
  // A missing file.
  same_refusal(text + (dir / "missing.txt").string(), "data file not found");
  // Text data pointed at an HDF5 token file, and at a uint16 token file.
  const std::string h5 = same_refusal(text + kFixtures + "gpt_tiny.h5", "is an HDF5 file");
  CHECK(h5.find("set data.kind: hdf5") != std::string::npos);
  std::string tokens;
  for (int i = 0; i < 5000; ++i) tokens += std::string{static_cast<char>(1 + i % 50), 0};
  write(dir / "tokens.bin", tokens);
  const std::string bin = same_refusal(text + (dir / "tokens.bin").string(), "holds a NUL byte at offset 1");
  CHECK(bin.find("set data.kind: bin") != std::string::npos);
  // A vocabulary smaller than the data's tokens: text holding byte 200, vocab 128.
  write(dir / "accents.txt", std::string(3000, 'a') + "\xc3\xa9" + std::string(3000, 'b'));
  same_refusal(text + (dir / "accents.txt").string() + " --set model.vocab_size=128", "holds byte 195");
  // The same for an HDF5 token file whose tokens exceed the vocabulary.
  write(dir / "good.txt", std::string(20000, 'x'));
  REQUIRE(run("data prepare " + (dir / "good.txt").string() + " " + (dir / "good.h5").string()).code == 0);
  same_refusal(" --set data.kind=hdf5 --set data.path=" + (dir / "good.h5").string() + " --set model.vocab_size=100",
               "holds tokens up to 120 (its max_token attribute) but model.vocab_size is 100");
  // The shipped recipes' placeholder data files are refused too (they cannot be trained).
  const Result placeholder = run("plan " + std::string(RUNNER_SOURCE_DIR) + "/recipes/llama-7b-8xh100.yaml", dir.string());
  CHECK(placeholder.code == 2);
  CHECK(placeholder.out.find("data/tokens.bin: data file not found") != std::string::npos);
  // Good text data plans (exit 0): the check is not a refusal of everything.
  CHECK(run("plan " + kQuick + text + (dir / "good.txt").string()).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("plan exits 2 on a recipe that does not fit, after the plan and what would fit") {
  for (const char* fmt : {"", " --json"}) {
    CAPTURE(fmt);
    const fs::path dir = test_support::fresh_dir("plan_gate", "fit");
    const std::string recipe = std::string(RUNNER_SOURCE_DIR) + "/recipes/does-not-fit.yaml";
    const test_support::SplitResult r = test_support::runner_split("plan " + recipe + fmt + " --no-data-check", dir);
    INFO(r.out << r.err);
    CHECK(r.code == 2);
    if (std::string(fmt).empty()) {
      CHECK(r.out.find("DOES NOT FIT") != std::string::npos);
      CHECK(r.out.find("what would fit:") != std::string::npos);
    } else {
      CHECK(r.out.find("\"fits\": false") != std::string::npos);
    }
    CHECK(r.err.find("the plan does not fit:") != std::string::npos);
    CHECK(r.err.rfind(recipe + ":", 0) == 0);  // located at the recipe's hardware section
    // Every suggestion states the batch equation it implies, and the equation holds.
    const std::regex eq(R"(-> global (\d+) = micro (\d+) x dp (\d+) x accum (\d+))");
    int suggestions = 0;
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), eq); it != std::sregex_iterator(); ++it) {
      const auto& m = *it;
      CHECK(std::stoll(m[1]) == std::stoll(m[2]) * std::stoll(m[3]) * std::stoll(m[4]));
      ++suggestions;
    }
    CHECK(suggestions >= 1);
    fs::remove_all(dir);
  }
  // A recipe that fits still exits 0: `runner plan r.yaml && sbatch ...` gates on fit.
  CHECK(run("plan " + kQuick).code == 0);
  CHECK(run("plan " + kQuick + " --json").code == 0);
}

TEST_CASE("plan reports every recipe mistake at once, each on its own located line") {
  const fs::path dir = test_support::fresh_dir("plan_gate", "many");
  write(dir / "draft.yaml",
        "name: draft\n"
        "model:\n"
        "  vocab_size: 256\n"
        "  block_size: 64\n"
        "  n_embd: 128\n"
        "  n_layers: 2\n"
        "  n_heads: 4\n"
        "batch: {micro_batch_size: 8}\n"
        "hardware: {device: h100}\n");
  const Result r = run("plan " + (dir / "draft.yaml").string());
  INFO(r.out);
  CHECK(r.code == 2);
  const std::string f = (dir / "draft.yaml").string();
  CHECK(r.out.find(f + ":4:3: unknown key 'block_size' in model; that is nanoGPT's name; here it is model.seq_len: write seq_len instead") == 0);
  CHECK(r.out.find("\n" + f + ":5:3: unknown key 'n_embd' in model;") != std::string::npos);
  CHECK(r.out.find("here it is model.d_model") != std::string::npos);
  CHECK(r.out.find("\n" + f + ":8:9: unknown key 'micro_batch_size' in batch; that is Megatron-LM's name; here it is batch.micro: write micro instead") != std::string::npos);
  CHECK(r.out.find("\n" + f + ":9:20: hardware.device must be one of") != std::string::npos);
  CHECK(r.out.find("did you mean 'h100-80gb'?") != std::string::npos);
  // The keys the misnamed ones stand for are not reported missing as well.
  CHECK(r.out.find("missing required key") == std::string::npos);
  CHECK(r.out.find("\n4 problems") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("data prepare refuses a binary file unless --binary-ok, and writes nothing") {
  const fs::path dir = test_support::fresh_dir("plan_gate", "prepare");
  const std::string h5 = kFixtures + "gpt_tiny.h5";
  Result r = run("data prepare " + h5 + " " + (dir / "out.h5").string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find(h5 + ": is an HDF5 file") == 0);
  CHECK(r.out.find("--binary-ok") != std::string::npos);
  CHECK(fs::is_empty(dir));
  std::string noise;
  for (int i = 0; i < 4096; ++i) noise += static_cast<char>(0x80 + (i * 37) % 120);
  write(dir / "noise.dat", noise);
  r = run("data prepare " + (dir / "noise.dat").string() + " " + (dir / "n.h5").string());
  CHECK(r.code == 2);
  CHECK(r.out.find("is not UTF-8 text") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "n.h5"));
  // Asked for: the bytes are tokenized.
  r = run("data prepare --binary-ok " + h5 + " " + (dir / "out.h5").string());
  CHECK(r.code == 0);
  CHECK(fs::exists(dir / "out.h5"));
  // Text with a few Latin-1 bytes is still text.
  write(dir / "latin1.txt", std::string(2000, 'a') + "caf\xe9 " + std::string(2000, 'b'));
  CHECK(run("data prepare " + (dir / "latin1.txt").string() + " " + (dir / "l.h5").string()).code == 0);
  fs::remove_all(dir);
}

// ZeRO-2 and 3 are planned, not yet trained: plan accepts them, train refuses them at the
// recipe's parallel.zero key (exit 2) before it writes anything; zero 1 still trains.
TEST_CASE("train refuses zero 2 and 3 at the recipe's parallel.zero line; plan shows them") {
  const fs::path dir = test_support::fresh_dir("plan_gate", "zero");
  std::ifstream in(kQuick);
  const std::string quick((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string text = quick + "\nparallel:\n  dp: 1\n  zero: 2\n";
  const int line = static_cast<int>(std::count(quick.begin(), quick.end(), '\n')) + 4;
  write(dir / "z2.yaml", text);
  const fs::path cwd = dir / "cwd";
  fs::create_directories(cwd);
  const Result train = run("train " + (dir / "z2.yaml").string() + " --set train.steps=1", cwd.string());
  INFO("train: " << train.out);
  CHECK(train.code == 2);
  CHECK(train.out.find((dir / "z2.yaml").string() + ":" + std::to_string(line) +
                       ":3: parallel.zero: 2 is planned but not yet run by the trainer") != std::string::npos);
  CHECK(train.out.find("use 1") != std::string::npos);
  CHECK(fs::is_empty(cwd));
  const Result plan = run("plan " + (dir / "z2.yaml").string(), cwd.string());
  INFO("plan: " << plan.out);
  CHECK(plan.code == 0);
  CHECK(plan.out.find("ZeRO-2: gradients and optimizer states divided by dp 1") != std::string::npos);
  CHECK(plan.out.find("ZeRO-2 with dp 1 shards nothing") != std::string::npos);
  // --set: the same refusal, located at --set.
  const Result set3 = run("train " + kQuick + " --set parallel.zero=3 train.steps=1", cwd.string());
  CHECK(set3.code == 2);
  CHECK(set3.out.find("parallel.zero: 3 is planned but not yet run by the trainer") != std::string::npos);
  fs::remove_all(dir);
}
