// `runner generate`: completions come from the training graph's logits (greedy = the argmax of
// a full forward pass over exactly the prefix, step by step), batching prompts of different
// lengths changes no completion, the samplers keep to their cuts and follow the softmax, and
// requests over the context or the plan's largest batch are refused before anything runs.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/generate/generate.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

using Result = test_support::SplitResult;
using test_support::runner_split;

// The quickstart at a tiny size, 30 steps at learning rate 3e-3, in each style.
using Fixture = const test_support::TinyQuickstartRun;
Fixture& fixture() { return test_support::tiny_quickstart("generate_gpt", 30, "3e-3"); }
Fixture& llama_fixture() { return test_support::tiny_quickstart("generate_llama", 30, "3e-3", test_support::kLlamaSets); }

}  // namespace

TEST_CASE("generate: greedy tokens are the argmax of a full forward pass over exactly the prefix") {
  for (const bool llama : {false, true}) {  // learned positions, and rope
  CAPTURE(llama);
  TrainedModel m = load_trained_model((llama ? llama_fixture() : fixture()).run.string());
  GenerateRequest req;
  req.prompts = {"12+34=", "7+8=", "100+900="};  // three lengths in one batch
  req.max_new_tokens = 6;
  auto got = generate(m, req);
  REQUIRE(got.size() == 3);
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    std::vector<int32_t> seq = byte_tokenize(req.prompts[i]);
    std::vector<int32_t> want;
    for (int k = 0; k < req.max_new_tokens; ++k) {
      const int64_t T = static_cast<int64_t>(seq.size());
      std::vector<float> L = full_forward_logits(m, seq, 1, T);  // a graph of exactly this length
      const float* row = L.data() + (T - 1) * 256;
      int32_t t = static_cast<int32_t>(std::max_element(row, row + 256) - row);
      want.push_back(t);
      seq.push_back(t);
    }
    CHECK(got[i].tokens == want);
    CHECK(got[i].finish == "length");
    CHECK(got[i].completion == byte_detokenize(want));
  }
  }
}

TEST_CASE("generate: a batch of prompts of different lengths completes each as it would alone; the seed decides") {
  TrainedModel m = load_trained_model(fixture().run.string());
  GenerateRequest req;
  req.prompts = {"1+2=", "345+678=", "9="};
  req.max_new_tokens = 8;
  req.sampling.temperature = 1.0;
  req.sampling.seed = 7;
  auto batch = generate(m, req);
  // Sampling is keyed by the prompt's index: prompt 0 alone draws what it drew in the batch.
  GenerateRequest first = req;
  first.prompts = {req.prompts[0]};
  CHECK(generate(m, first)[0].tokens == batch[0].tokens);
  auto again = generate(m, req);
  for (size_t i = 0; i < batch.size(); ++i) CHECK(again[i].tokens == batch[i].tokens);
  req.sampling.seed = 8;
  auto other = generate(m, req);
  bool differs = false;
  for (size_t i = 0; i < batch.size(); ++i) differs = differs || other[i].tokens != batch[i].tokens;
  CHECK(differs);
  // Greedy alone vs in a batch: identical for every prompt.
  req.sampling.temperature = 0;
  auto gb = generate(m, req);
  for (size_t i = 0; i < req.prompts.size(); ++i) {
    GenerateRequest one = req;
    one.prompts = {req.prompts[i]};
    CHECK(generate(m, one)[0].tokens == gb[i].tokens);
  }
  // --stop ends a completion once it ends with the text, and says so.
  req.stop = std::string(1, static_cast<char>(gb[1].tokens[1]));
  auto stopped = generate(m, req);
  CHECK(stopped[1].finish == "stop");
  CHECK(stopped[1].tokens.size() <= 2);
}

TEST_CASE("generate: sample_token keeps to top-k and top-p and follows softmax(logits / temperature)") {
  const std::vector<float> L = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};
  SamplingConfig s;
  CHECK(sample_token(L.data(), 5, s, 0.9f) == 1);  // greedy: the largest, smallest id among equals
  s.temperature = 1.0;
  s.top_k = 1;
  CHECK(sample_token(L.data(), 5, s, 0.99f) == 1);
  // Frequencies over a fine grid of draws equal the softmax over the top 3 (ids 1, 4, 2).
  s.top_k = 3;
  std::map<int32_t, int> count;
  const int n = 100000;
  for (int i = 0; i < n; ++i) count[sample_token(L.data(), 5, s, (i + 0.5f) / n)]++;
  CHECK(count.size() == 3);
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  CHECK(count[1] / double(n) == doctest::Approx(std::exp(3.0) / z).epsilon(1e-3));
  CHECK(count[2] / double(n) == doctest::Approx(std::exp(2.0) / z).epsilon(1e-3));
  // top-p: the nucleus of probability >= 0.5 over all five is ids {1, 4}.
  s.top_k = 0;
  s.top_p = 0.5;
  count.clear();
  for (int i = 0; i < 1000; ++i) count[sample_token(L.data(), 5, s, (i + 0.5f) / 1000)]++;
  CHECK(count.size() == 2);
  CHECK(count[1] == 500);
  CHECK(count[4] == 500);
  // Temperature: low is nearly greedy between the two equal maxima; high flattens.
  s.top_p = 1.0;
  s.temperature = 0.05;
  count.clear();
  for (int i = 0; i < 1000; ++i) count[sample_token(L.data(), 5, s, (i + 0.5f) / 1000)]++;
  CHECK(count[1] + count[4] == 1000);
}

TEST_CASE("generate CLI: text, --json records, refusals before running with the numbers") {
  Fixture& f = fixture();
  const std::string run = f.run.string();
  Result one = runner_split("generate " + run + " --prompt '12+3' --max-new-tokens 5", f.dir);
  INFO(one.err);
  CHECK(one.code == 0);
  TrainedModel m = load_trained_model(run);
  GenerateRequest req;
  req.prompts = {"12+3"};
  req.max_new_tokens = 5;
  const std::string want = "12+3" + generate(m, req)[0].completion;
  CHECK(one.out.substr(0, want.size()) == want);

  std::ofstream(f.dir / "prompts.txt") << "1+1=\n\n22+333=\n";
  Result js = runner_split("generate " + run + " --prompts " + (f.dir / "prompts.txt").string() +
                             " --json --max-new-tokens 4 --temperature 0.7 --top-k 10 --top-p 0.9 --seed 5",
                         f.dir);
  INFO(js.err);
  CHECK(js.code == 0);
  std::istringstream lines(js.out);
  std::vector<nlohmann::json> recs;
  for (std::string l; std::getline(lines, l);) recs.push_back(nlohmann::json::parse(l));
  REQUIRE(recs.size() == 2);  // the empty line is no prompt
  CHECK(recs[1]["prompt"] == "22+333=");
  CHECK(recs[1]["new_tokens"] == 4);
  CHECK(recs[1]["tokens"].size() == 4);

  Result ctx = runner_split("generate " + run + " --prompt '123456789' --max-new-tokens 30", f.dir);
  CHECK(ctx.code == 2);
  CHECK(ctx.out.empty());
  CHECK(ctx.err.find("9 tokens) plus --max-new-tokens 30 is 39 tokens, over the model's context of 32") != std::string::npos);
  CHECK(ctx.err.find("at most 23 new tokens") != std::string::npos);
  // A prompt longer than the context itself: no "at most -N new tokens", but how long it may be.
  Result over = runner_split("generate " + run + " --prompt '" + std::string(40, '1') + "' --max-new-tokens 5", f.dir);
  CHECK(over.code == 2);
  CHECK(over.err.find("at most -") == std::string::npos);
  CHECK(over.err.find("shorten it to at most 31 tokens") != std::string::npos);

  // The plan's largest inference batch (weights and KV cache in a tiny custom device).
  std::ofstream pf(f.dir / "many.txt");
  for (int i = 0; i < 40; ++i) pf << i << "+1=\n";
  pf.close();
  const std::string sets = " --set hardware.device=custom hardware.memory_gb=0.0002 inference.batch=1";
  m = load_trained_model(run,
                         {"hardware.device=custom", "hardware.memory_gb=0.0002", "inference.batch=1"});
  REQUIRE(m.plan.inference);
  const int64_t maxb = m.plan.inference->max_batch;
  REQUIRE(maxb > 0);
  REQUIRE(maxb < 40);
  Result big = runner_split("generate " + run + " --prompts " + (f.dir / "many.txt").string() + sets, f.dir);
  CHECK(big.code == 2);
  CHECK(big.err.find("40 prompts are more than the plan's largest inference batch, " + std::to_string(maxb)) !=
        std::string::npos);
  Result bad = runner_split("generate " + run + " --prompt x --top-p 0", f.dir);
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--top-p 0 is outside (0, 1]") != std::string::npos);
  Result none = runner_split("generate " + (f.dir / "missing").string() + " --prompt x", f.dir);
  CHECK(none.code == 2);
}

// The addition task writes sums least significant digit first: a model trained on it says so
// on stderr, with its digits, so that "123+456=9750" is read as 579; stdout stays the completion.
TEST_CASE("generate CLI: a model of the addition task says how its answers read") {
  Fixture& f = fixture();
  Result r = runner_split("generate " + f.run.string() + " --prompt '012+345=' --max-new-tokens 4", f.dir);
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  CHECK(r.err.find("note: this model learned data.kind addition (3 digits): prompts are written as \"123+456=\"") !=
        std::string::npos);
  CHECK(r.err.find("least significant digit first, padded to 4: \"9750\" means 579") != std::string::npos);
  CHECK(r.out.find("note:") == std::string::npos);
  CHECK(r.out.rfind("012+345=", 0) == 0);
}

// A byte-level model sampled hot emits any byte: control bytes (ESC, BEL, NUL) and bytes that are
// no UTF-8. On a terminal they are written as \xNN, valid UTF-8 as it is; a pipe gets the bytes.
TEST_CASE("generate CLI: on a terminal, bytes that would garble it are escaped") {
  Fixture& f = fixture();
  const std::string args = " generate " + f.run.string() + " --prompt 'ab' --max-new-tokens 28 --temperature 50 --seed 1";
  Result pipe = runner_split(args, f.dir);
  REQUIRE(pipe.code == 0);
  Result js = runner_split(args + " --json", f.dir);
  REQUIRE(js.code == 0);
  std::string raw = "ab";
  const nlohmann::json rec = nlohmann::json::parse(js.out.substr(0, js.out.find('\n')));
  for (int t : rec["tokens"]) raw += static_cast<char>(t);
  CHECK(pipe.out == raw + "\n");  // a pipe: the bytes as they are
  int control = 0;
  for (unsigned char c : raw) control += c < 0x20 && c != '\n' && c != '\t';
  REQUIRE(control > 0);  // the seed makes some: the test has something to escape
  test_support::Result tty = test_support::sh("/usr/bin/python3 " + std::string(RUNNER_TEST_DIR) + "/python/on_terminal.py " + RUNNER_BINARY +
                                args + " 2>/dev/null");
  INFO(tty.out);
  REQUIRE(tty.code == 0);
  const std::string shown = tty.out.substr(0, tty.out.find("note:"));  // the addition note follows on stderr
  // Nothing a terminal would act on, and every byte back when the escapes are read.
  std::string back;
  for (size_t i = 0; i < shown.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(shown[i]);
    CHECK((c >= 0x20 || c == '\n' || c == '\t'));
    CHECK(c != 0x7f);
    if (c == '\\' && i + 3 < shown.size() && shown[i + 1] == 'x') {
      back += static_cast<char>(std::stoi(shown.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      back += static_cast<char>(c);
    }
  }
  CHECK(back == raw + "\n");
  CHECK(shown.find("\\x") != std::string::npos);
}
