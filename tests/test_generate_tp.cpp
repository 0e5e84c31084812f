// `runner generate` under mpirun on the recipe's tensor-parallel layout (docs/generate.md,
// Layouts): a model trained on tp2 generates, on two ranks with the same layout (each caching
// its own heads, the vocabulary shards gathered), the same greedy tokens as the same
// checkpoint on one rank, and the logits each token was chosen from agree to 1e-5 relative
// (fp32), with and without the KV cache; the cache per rank is the one-rank cache / tp; tp2 x
// dp2 replicas print once, the same; the same for a model trained on pp2, generated on pp2
// (each stage caching its layers, activations passed stage to stage).
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

#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const test_support::TempDir kScratch("generate_tp");
const fs::path& kDir = kScratch.path;

using Out = test_support::SplitResult;

// `prefix runner ARGS`, stdout and stderr captured apart.
Out run(const std::string& prefix, const std::string& args) { return test_support::runner_split(args, kDir, prefix); }

std::vector<float> read_floats(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<float> v;
  float x;
  while (in.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

// The trained tp2 run (the support library's layout model: vocabulary 63, padded to 64 under tp2).
const fs::path& tp2_run() {
  static fs::path run;
  if (run.empty()) {
    const fs::path recipe = test_support::write_layout_recipe(kDir);
    run = kDir / "tp2";
    test_support::Result r = test_support::sh(test_support::mpirun(2) + RUNNER_BINARY + " train " + recipe.string() +
                                            " --quiet --run-dir " + run.string() + " --set parallel.tp=2");
    INFO(r.out);
    REQUIRE(r.code == 0);
    std::ofstream(kDir / "prompts.txt") << "12+34=\n7+8=\n99+1=\n";
  }
  return run;
}

const char* kOneRank = "OMP_NUM_THREADS=1 ";

// Trains kDir/NAME from the layout recipe on two ranks with `sets` (after tp2_run(), which
// writes the recipe and the prompts).
fs::path train_two_ranks(const std::string& name, const std::string& sets) {
  tp2_run();
  const fs::path rd = kDir / name;
  test_support::Result r = test_support::sh(test_support::mpirun(2) + RUNNER_BINARY + " train " +
                                            (kDir / "layout.yaml").string() + " --quiet --run-dir " + rd.string() +
                                            " " + sets);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return rd;
}

// The "kv_cache_bytes" of a --stats line on stderr.
long long kv_cache_bytes(const std::string& err) {
  const size_t k = err.find("\"kv_cache_bytes\":");
  REQUIRE(k != std::string::npos);
  return std::stoll(err.substr(k + 17));
}

// Max over the chosen tokens' logits rows of max|a - b| / max|a|.
double worst_relative(const std::vector<float>& a, const std::vector<float>& b, int64_t V) {
  double worst = 0;
  for (size_t r = 0; r + static_cast<size_t>(V) <= a.size(); r += static_cast<size_t>(V)) {
    double d = 0, m = 0;
    for (size_t j = r; j < r + static_cast<size_t>(V); ++j) {
      d = std::max(d, std::fabs(static_cast<double>(a[j]) - b[j]));
      m = std::max(m, std::fabs(static_cast<double>(a[j])));
    }
    worst = std::max(worst, d / m);
  }
  return worst;
}

// `generate RD` of the prompts, 8 new tokens, on one rank and on two under mpirun, `extra`
// added: CHECKs that both succeed and print the same tokens, and that the logits of the chosen
// tokens agree within 1e-5 relative (`label` names the pair in the message).
struct OneVsTwo {
  Out one, two;
  size_t logits = 0;  // floats written by the one-rank run
};
OneVsTwo one_vs_two_ranks(const fs::path& rd, const std::string& extra, const std::string& label) {
  const std::string args = "generate " + rd.string() + " --prompts " + (kDir / "prompts.txt").string() +
                           " --max-new-tokens 8 --json --stats --logits-out ";
  OneVsTwo c{run(kOneRank, args + (kDir / "one.bin").string() + extra),
             run(test_support::mpirun(2), args + (kDir / "two.bin").string() + extra)};
  INFO(c.one.err << c.two.err);
  REQUIRE(c.one.code == 0);
  REQUIRE(c.two.code == 0);
  CHECK(c.two.out == c.one.out);  // the same greedy tokens, printed once
  const std::vector<float> a = read_floats(kDir / "one.bin"), b = read_floats(kDir / "two.bin");
  REQUIRE(a.size() == b.size());
  c.logits = a.size();
  const double rel = worst_relative(a, b, 63);
  MESSAGE(label << ": worst relative logit difference " << rel);
  CHECK(rel <= 1e-5);
  return c;
}

}  // namespace

TEST_CASE("generate on tp2 under mpirun: the one-rank tokens, logits within 1e-5 relative, cache / tp") {
  const fs::path& rd = tp2_run();
  for (const std::string cache : {"", " --no-kv-cache"}) {
    CAPTURE(cache);
    const OneVsTwo c = one_vs_two_ranks(rd, cache, "tp2 vs one rank" + (cache.empty() ? " (KV cache)" : cache));
    CHECK(!c.one.out.empty());
    CHECK(c.logits == 3u * 8u * 63u);  // 3 prompts x 8 tokens x the real vocabulary
    if (cache.empty()) {  // each tp rank caches its own heads: the cache is the one-rank cache / 2
      const long long b1 = kv_cache_bytes(c.one.err), b2 = kv_cache_bytes(c.two.err);
      MESSAGE("KV cache bytes: one rank " << b1 << ", per tp2 rank " << b2);
      CHECK(b1 > 0);
      CHECK(b2 * 2 == b1);
    }
  }
}

// Grouped-query attention: with 2 key-value heads each tp2 rank caches one (half the one-rank
// cache); with one (multi-query) both ranks hold and cache it (replicated: the one-rank cache).
TEST_CASE("generate with grouped-query attention on tp2: key-value heads split or replicated, the one-rank tokens and logits") {
  for (int kv : {2, 1}) {
    CAPTURE(kv);
    const fs::path rd = train_two_ranks("tp2_kv" + std::to_string(kv),
                                        "--set parallel.tp=2 model.n_kv_heads=" + std::to_string(kv));
    const OneVsTwo c = one_vs_two_ranks(rd, "", "gqa kv " + std::to_string(kv) + ", tp2 vs one rank");
    const long long b1 = kv_cache_bytes(c.one.err), b2 = kv_cache_bytes(c.two.err);
    CHECK(b1 > 0);
    CHECK(b2 * (kv == 2 ? 2 : 1) == b1);
  }
}

TEST_CASE("generate on tp2 x dp2: the replicas generate the same, rank 0 prints") {
  const fs::path& rd = tp2_run();
  const std::string args = "generate " + rd.string() + " --prompts " + (kDir / "prompts.txt").string() + " --max-new-tokens 6 --json";
  Out one = run(kOneRank, args);
  Out dp = run(test_support::mpirun(4), args);
  INFO(one.err << dp.err);
  REQUIRE(one.code == 0);
  REQUIRE(dp.code == 0);
  CHECK(dp.out == one.out);
}

TEST_CASE("generate on pp2 under mpirun: each stage its layers' cache, the one-rank tokens, logits within 1e-5 relative") {
  const fs::path rd = train_two_ranks("pp2", "--set parallel.pp=2");
  for (const std::string cache : {"", " --no-kv-cache"}) {
    CAPTURE(cache);
    const OneVsTwo c = one_vs_two_ranks(rd, cache, "pp2 vs one rank" + (cache.empty() ? " (KV cache)" : cache));
    CHECK(!c.one.out.empty());
    CHECK(c.logits == 3u * 8u * 63u);
    if (cache.empty()) {  // rank 0 (stage 0) caches its layer only: half the one-rank cache (2 layers)
      const long long b1 = kv_cache_bytes(c.one.err), b2 = kv_cache_bytes(c.two.err);
      MESSAGE("KV cache bytes: one rank " << b1 << ", pp2 stage 0 " << b2);
      CHECK(b2 * 2 == b1);
    }
  }
}
