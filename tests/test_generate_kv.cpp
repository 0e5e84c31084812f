// The KV cache of `runner generate` (runner/generate/decoder.h, ops/kv_cache.h): cached
// decoding reproduces a full forward pass over the same prefix at every position (fp32 to
// 1e-5 relative to the largest logit; bf16, fp16 and int8 caches within the bounds measured and
// written in docs/generate.md), batched prompts of different lengths included; greedy output
// is the same with and without the cache; the tracker's kv_cache bytes are the plan's
// KV-cache figure exactly; and requests over the plan's sizing are refused before allocating.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ops/tensor.h"
#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/generate/decoder.h"
#include "runner/generate/generate.h"
#include "tests/support/errors.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

// A tiny model trained on addition for a few seconds (2 layers, d_model 32, 2 heads, context
// 32): confident enough that its logits span several units.
using Fixture = const test_support::TinyQuickstartRun;
Fixture& gpt_fixture() { return test_support::tiny_quickstart("generate_kv_gpt", 150, "1e-2"); }
Fixture& llama_fixture() { return test_support::tiny_quickstart("generate_kv_llama", 150, "1e-2", test_support::kLlamaSets); }
// Grouped-query attention: 4 query heads (head size 8) sharing 2 key-value heads.
Fixture& gqa_fixture() {
  return test_support::tiny_quickstart("generate_kv_gqa", 150, "1e-2",
                                       std::string(test_support::kLlamaSets) + " model.n_heads=4 model.n_kv_heads=2");
}

const std::vector<std::string> kTexts = {"12+34=46\n7+8=15\n100+9", "345+678=1023\n1+1=2\n55+", "9+9=18\n"};
const std::vector<int64_t> kPrompt = {5, 11, 1};  // prefill lengths: three different, one of a single token

// Max |cached - full| over every position of every row and the real vocabulary: rows are
// prefilled together to their prompt lengths (padded to the longest), then decoded one token
// per step, each row at its own position, fed its own text (teacher forcing).
// Four prompts of different lengths (one of a single token), 12 new tokens each.
GenerateRequest four_prompts() {
  GenerateRequest req;
  req.prompts = {"12+34=", "7+8=", "100+900=", "5"};
  req.max_new_tokens = 12;
  return req;
}

// CHECKs that `m` completes `req` with the KV cache exactly as without it: the same tokens,
// stopped for the same reason.
void check_cache_matches_full(TrainedModel& m, GenerateRequest req) {
  req.kv_cache = false;
  const auto ref = generate(m, req);
  req.kv_cache = true;
  const auto got = generate(m, req);
  REQUIRE(got.size() == ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].tokens == ref[i].tokens);
    CHECK(got[i].finish == ref[i].finish);
  }
}

struct Diff {
  double abs = 0;        // max |cached - full| over every position and vocabulary entry
  double rel = 0;        // max over positions of (max |cached - full|) / (max |full logit|) at that position
  double max_logit = 0;  // the largest |full logit|
};
Diff cached_vs_full(TrainedModel& m) {
  const int64_t V = m.model().vocab_size, B = static_cast<int64_t>(kTexts.size());
  std::vector<std::vector<int32_t>> seq;
  int64_t longest = 0, Tp = 0;
  for (size_t i = 0; i < kTexts.size(); ++i) {
    seq.push_back(byte_tokenize(kTexts[i]));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(seq.back().size()));
    Tp = std::max(Tp, kPrompt[i]);
  }
  std::vector<std::vector<float>> full;
  for (auto& s : seq) full.push_back(full_forward_logits(m, s, 1, static_cast<int64_t>(s.size())));
  CachedDecoder dec(m, B, longest);
  Diff d;
  auto compare = [&](size_t i, int64_t pos, const float* row) {
    const float* want = full[i].data() + pos * V;
    double worst = 0, big = 0;
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, static_cast<double>(std::fabs(row[v] - want[v])));
      big = std::max(big, static_cast<double>(std::fabs(want[v])));
    }
    d.abs = std::max(d.abs, worst);
    d.rel = std::max(d.rel, worst / big);
    d.max_logit = std::max(d.max_logit, big);
  };
  std::vector<int32_t> tokens(static_cast<size_t>(B * Tp), '\n');
  for (size_t i = 0; i < seq.size(); ++i) std::copy_n(seq[i].begin(), kPrompt[i], tokens.begin() + static_cast<int64_t>(i) * Tp);
  // The logits cross out of the run's device (the strict device under RUNNER_STRICT=1) row by row.
  std::vector<int64_t> all(static_cast<size_t>(B * Tp));
  for (int64_t r = 0; r < B * Tp; ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<float> L0 = logits_rows_to_host(dec.prefill(tokens, Tp), all, V);
  for (size_t i = 0; i < seq.size(); ++i)
    for (int64_t p = 0; p < kPrompt[i]; ++p) compare(i, p, L0.data() + (static_cast<int64_t>(i) * Tp + p) * V);
  std::vector<int64_t> next(kPrompt);  // each row's next position
  std::vector<int32_t> tok(static_cast<size_t>(B)), pos(static_cast<size_t>(B));
  for (bool any = true; any;) {
    any = false;
    for (size_t i = 0; i < seq.size(); ++i) {
      const int64_t p = std::min<int64_t>(next[i], static_cast<int64_t>(seq[i].size()) - 1);  // a finished row repeats
      tok[i] = seq[i][static_cast<size_t>(p)];
      pos[i] = static_cast<int32_t>(p);
      any = any || next[i] < static_cast<int64_t>(seq[i].size());
    }
    if (!any) break;
    std::vector<int64_t> rows(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) rows[static_cast<size_t>(i)] = i;
    const std::vector<float> L = logits_rows_to_host(dec.step(tok, pos), rows, V);
    for (size_t i = 0; i < seq.size(); ++i)
      if (next[i] < static_cast<int64_t>(seq[i].size())) compare(i, next[i]++, L.data() + static_cast<int64_t>(i) * V);
  }
  return d;
}

}  // namespace

TEST_CASE("KV cache, fp32: cached logits equal a full forward pass at every position (relative 1e-5), batched") {
  for (const bool llama : {false, true}) {  // learned positions, and rope at each row's position
    CAPTURE(llama);
    TrainedModel m = load_trained_model((llama ? llama_fixture() : gpt_fixture()).run.string(),
                                        {"inference.kv_dtype=fp32", "inference.batch=3"});
    const Diff d = cached_vs_full(m);
    MESSAGE(std::string(llama ? "llama" : "gpt") << " fp32 cache: max abs logit difference " << d.abs << ", relative "
                                                 << d.rel << " (largest |logit| " << d.max_logit << ")");
    CHECK(d.max_logit > 4.0);  // the logits are not trivially small
    // Relative: at each position, the largest difference over the vocabulary divided by the
    // largest |logit| there (the GEMMs of a 1-row decode step and of a T-row forward sum in
    // different orders: a few ulps of the logits). Measured ~8e-7; max abs ~8e-6 at |logit| ~10.
    CHECK(d.rel <= 1e-5);
  }
}

TEST_CASE("KV cache, bf16 / fp16 / int8: cached logits within the measured bounds of docs/generate.md") {
  // Max abs logit difference: the worst measured over both models (docs/generate.md: bf16
  // 0.070, fp16 0.0046, int8 0.078, at |logit| up to ~10.7), times about 3.
  const std::vector<std::pair<std::string, double>> bounds = {{"bf16", 0.2}, {"fp16", 0.015}, {"int8", 0.25}};
  for (const bool llama : {false, true}) {
    for (const auto& [dt, bound] : bounds) {
      CAPTURE(llama);
      CAPTURE(dt);
      TrainedModel m = load_trained_model((llama ? llama_fixture() : gpt_fixture()).run.string(),
                                          {"inference.kv_dtype=" + dt, "inference.batch=3"});
      const Diff d = cached_vs_full(m);
      MESSAGE(std::string(llama ? "llama " : "gpt ") << dt << " cache: max abs logit difference " << d.abs << ", relative "
                                                     << d.rel << " (largest |logit| " << d.max_logit << ")");
      CHECK(d.abs > 1e-4);  // the format does round (fp32 stays under 1e-5)
      CHECK(d.abs <= bound);
    }
  }
}

TEST_CASE("KV cache: greedy completions equal those without a cache (prompts of different lengths)") {
  for (const bool llama : {false, true}) {
    CAPTURE(llama);
    TrainedModel m = load_trained_model((llama ? llama_fixture() : gpt_fixture()).run.string());
    GenerateRequest req = four_prompts();
    check_cache_matches_full(m, req);
    // Sampling draws the same tokens too (same logits to rounding, same draws).
    req.sampling.temperature = 0.8;
    req.sampling.seed = 3;
    check_cache_matches_full(m, req);
  }
}

TEST_CASE("KV cache: the tracker's kv_cache bytes are the plan's KV-cache figure, for every format") {
  auto& mt = ops::MemoryTracker::instance();
  for (const std::string dt : {"fp32", "bf16", "fp16", "int8"}) {
    CAPTURE(dt);
    TrainedModel m = load_trained_model(llama_fixture().run.string(),
                                        {"inference.kv_dtype=" + dt, "inference.batch=3", "inference.context=20"});
    REQUIRE(m.plan.inference);
    const size_t before = mt.current(ops::Account::KvCache);
    {
      CachedDecoder dec(m, 2, 20);  // two prompts in a cache of three sequences
      const size_t measured = mt.current(ops::Account::KvCache) - before;
      // 2 (K, V) x 2 layers x 3 sequences x 20 positions x (32 channels x bytes + int8: 2 heads x 4).
      const size_t bytes = dt == "fp32" ? 4 : dt == "int8" ? 1 : 2;
      const size_t want = 2 * 2 * 3 * 20 * (32 * bytes + (dt == "int8" ? 2 * 4 : 0));
      CHECK(measured == want);
      CHECK(static_cast<double>(measured) == m.plan.inference->kv_cache);
      CHECK(measured == dec.cache().bytes());
      CHECK(static_cast<double>(measured) == 3 * m.plan.inference->kv_per_sequence);
    }
    CHECK(mt.current(ops::Account::KvCache) == before);  // released with the decoder
  }
}

// The cache holds the key-value heads only: half the channels of the multi-head model of the
// same width, measured, planned and allocated alike; decoding over it still equals the full
// forward pass, and greedy output is the same with and without it.
TEST_CASE("KV cache with grouped-query attention: cached logits equal a full forward; the cache holds the key-value heads only") {
  TrainedModel m = load_trained_model(gqa_fixture().run.string(),
                                      {"inference.kv_dtype=fp32", "inference.batch=3"});
  REQUIRE(m.model().kv_heads() == 2);
  const Diff d = cached_vs_full(m);
  MESSAGE("gqa fp32 cache: max abs logit difference " << d.abs << ", relative " << d.rel << " (largest |logit| "
                                                      << d.max_logit << ")");
  CHECK(d.max_logit > 4.0);
  CHECK(d.rel <= 1e-5);
  auto& mt = ops::MemoryTracker::instance();
  const size_t before = mt.current(ops::Account::KvCache);
  {
    CachedDecoder dec(m, 2, 20);
    const size_t measured = mt.current(ops::Account::KvCache) - before;
    // 2 (K, V) x 2 layers x 3 sequences x 32 positions x 2 key-value heads x head size 8 x 4 bytes.
    CHECK(measured == 2 * 2 * 3 * 32 * (2 * 8 * 4));
    CHECK(static_cast<double>(measured) == m.plan.inference->kv_cache);
    CHECK(measured == dec.cache().bytes());
  }
  TrainedModel mha = load_trained_model(llama_fixture().run.string(),
                                        {"inference.kv_dtype=fp32", "inference.batch=3"});
  CHECK(m.plan.inference->kv_per_sequence * 2 == mha.plan.inference->kv_per_sequence);  // 2 of 4 heads vs 2 of 2 (d_model 32)
  TrainedModel g = load_trained_model(gqa_fixture().run.string());  // no inference sizing
  check_cache_matches_full(g, four_prompts());
}

TEST_CASE("KV cache: a request over the plan's batch or context is refused before allocating, with the numbers") {
  auto& mt = ops::MemoryTracker::instance();
  Fixture& f = gpt_fixture();
  TrainedModel m = load_trained_model(f.run.string(),
                                      {"inference.kv_dtype=bf16", "inference.batch=2", "inference.context=16"});
  REQUIRE(m.plan.inference);
  REQUIRE(m.plan.inference->max_batch >= 3);
  mt.reset_peaks();
  REQUIRE(mt.peak(ops::Account::KvCache) == 0);
  GenerateRequest req;
  req.prompts = {"1+1=", "2+2=", "3+3="};
  req.max_new_tokens = 4;
  std::string s = test_support::expect_user_error([&] { generate(m, req); }, "three prompts in a cache of two were accepted").what();
  CHECK(s.find("3 prompts are more than the KV cache's 2 sequences (inference.batch 2") != std::string::npos);
  CHECK(s.find("--set inference.batch=3") != std::string::npos);
  req.prompts = {"123+456=", "1"};
  req.max_new_tokens = 10;  // 18 tokens, over the cache's 16
  s = test_support::expect_user_error([&] { generate(m, req); }, "18 tokens in a context of 16 were accepted").what();
  CHECK(s.find("is 18 tokens, over the KV cache's context of 16") != std::string::npos);
  CHECK(mt.peak(ops::Account::KvCache) == 0);  // nothing was allocated
  req.max_new_tokens = 8;  // 16: fits
  CHECK(generate(m, req)[0].tokens.size() == 8);
  CHECK(mt.peak(ops::Account::KvCache) == static_cast<size_t>(m.plan.inference->kv_cache));

  // The CLI says the same with exit code 2 and prints nothing; --no-kv-cache is the reference.
  const std::string run = f.run.string();
  const test_support::SplitResult r = test_support::runner_split(
      "generate " + run + " --prompt '123+456=' --max-new-tokens 10 --set inference.context=16", f.dir);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("over the KV cache's context of 16") != std::string::npos);
  const test_support::SplitResult a =
      test_support::runner_split("generate " + run + " --prompt '12+34=' --max-new-tokens 8", f.dir);
  const test_support::SplitResult b =
      test_support::runner_split("generate " + run + " --prompt '12+34=' --max-new-tokens 8 --no-kv-cache", f.dir);
  CHECK(a.code == 0);
  CHECK(b.code == 0);
  CHECK(a.out == b.out);
  // Generation under mpirun (tp layouts): tests/test_generate_tp.cpp.
}
