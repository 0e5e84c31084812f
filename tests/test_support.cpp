// The test-support library (tests/support/) keeps its promises, since every other test leans on
// them: a TempDir is unique and gone with its owner (never removed by a forked child), exit
// codes read as a shell reports them (128 + signal), stdout and stderr come back apart when
// asked, and the shared layout recipe loads as the recipe the other tests describe.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runner/recipe/recipe.h"
#include "tests/support/models.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;

TEST_CASE("TempDir: a new empty directory per object, removed with it but not by a forked child") {
  fs::path kept;
  {
    test_support::TempDir a("support"), b("support");
    CHECK(a.path != b.path);
    CHECK(fs::is_directory(a.path));
    CHECK(fs::is_empty(a.path));
    std::ofstream(a / "f") << "x";
    CHECK(test_support::slurp(a.file("f")) == "x");
    const pid_t child = ::fork();
    if (child == 0) {
      a.~TempDir();  // what unwinding would do in the child: the parent's directory must stay
      ::_exit(0);
    }
    CHECK(test_support::wait_exit(child) == 0);
    CHECK(fs::exists(a / "f"));
    kept = a.path;
  }
  CHECK_FALSE(fs::exists(kept));
}

TEST_CASE("fresh_dir: emptied when made, the same name for the same suite and test") {
  const fs::path d = test_support::fresh_dir("support", "fresh");
  std::ofstream(d / "old") << "x";
  CHECK(test_support::fresh_dir("support", "fresh") == d);
  CHECK(fs::is_empty(d));
}

TEST_CASE("sh and runner_split: exit codes as a shell reports them, streams together or apart") {
  const test_support::Result r = test_support::sh("echo out; echo err >&2; exit 3");
  CHECK(r.code == 3);
  CHECK(r.out == "out\nerr\n");
  CHECK(test_support::sh("kill -9 $$").code == 128 + SIGKILL);
  const test_support::TempDir dir("support");
  const test_support::SplitResult v = test_support::runner_split("--version", dir);
  CHECK(v.code == 0);
  CHECK_FALSE(v.out.empty());
  const test_support::SplitResult bad = test_support::runner_split("no-such-command", dir);
  CHECK(bad.code != 0);
  CHECK(bad.out.empty());
  CHECK_FALSE(bad.err.empty());
}

TEST_CASE("spawn_runner: the runner's own pid, its signal in the exit code") {
  const pid_t pid = test_support::spawn_runner({"--version"});
  CHECK(test_support::wait_exit(pid) == 0);
  const test_support::TempDir dir("support");
  const pid_t run = test_support::spawn_runner(
      test_support::split("train " + test_support::quickstart_recipe() + " --quiet --run-dir " + dir.file("run")));
  CHECK(test_support::signal_when(run, SIGKILL, [] { return true; }, 1));
  CHECK(test_support::wait_exit(run) == 128 + SIGKILL);
}

TEST_CASE("the shared recipes and models are the ones the tests describe") {
  const test_support::TempDir dir("support");
  const runner::Recipe r = runner::load_recipe(test_support::write_layout_recipe(dir).string(), {});
  CHECK(r.model.vocab_size == 63);
  CHECK(r.model.n_layers == 2);
  CHECK(r.batch.global == 8);
  CHECK(r.batch.micro == 2);
  CHECK(r.checkpoint.every_steps == 5);
  runner::ModelConfig m = test_support::small_model(61, 16, 32, 4, 2);
  CHECK(m.norm == runner::Norm::layernorm);
  test_support::make_llama(m);
  CHECK(m.norm == runner::Norm::rmsnorm);
  CHECK(m.activation == runner::Activation::swiglu);
  CHECK(m.position == runner::Position::rope);
  CHECK_FALSE(m.tie_embeddings);
  CHECK_FALSE(m.bias);
  const test_support::TokenBatch b = test_support::random_tokens(100, 61);
  REQUIRE(b.tok.size() == 100);
  for (size_t i = 0; i < b.tok.size(); ++i) CHECK((b.tok[i] >= 0 && b.tok[i] < 61 && b.tgt[i] >= 0 && b.tgt[i] < 61));
}
