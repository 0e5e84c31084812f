// Work is never lost or overwritten, through the real binary: Ctrl-C stops
// like SIGTERM and a second one exits at once; a finished run stays as it is on resume and on
// train; relative recipe paths are read beside the recipe and stored absolute, so a run
// resumes from any directory; a changed recipe is listed, recorded and the earlier one kept
// (a change the checkpoint cannot take is still refused, and then nothing is written); a
// resume names the live owner of a directory that has no checkpoint yet.
//
// The runs are the quickstart at a tiny size (d_model 32, context 32): a step takes
// milliseconds, so each case trains for real and stays within a few seconds.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "runner/checkpoint/checkpoint.h"
#include "runner/recipe/recipe.h"
#include "runner/run/recipe_history.h"
#include "tests/support/a_runs.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::Result;
using test_support::slurp;

namespace {

Result cli(const std::string& args, const std::string& cwd = "") { return test_support::runner_cmd(args, cwd); }

fs::path fresh(const std::string& name) { return test_support::fresh_dir("work_kept", name); }

// `runner train` of the tiny quickstart for `steps` steps into `run`, a checkpoint every
// `every` steps, one thread; `extra`: more --set overrides (k=v ...).
std::string tiny(const fs::path& run, int steps, int every, const std::string& extra = "") {
  return test_support::tiny_quickstart_args(run, steps, 32) + " checkpoint.every_steps=" + std::to_string(every) +
         " train.threads=1 " + extra;
}

std::vector<nlohmann::json> events(const fs::path& run) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run / "events.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// A long tiny run started in the background, its output in RUN/../out.txt, once it has
// recorded `steps` steps; `env`: NAME=value pairs for it.
pid_t started_long_run(const fs::path& run, size_t steps, const std::vector<std::string>& env = {}) {
  const pid_t pid = test_support::spawn_runner(test_support::split(tiny(run, 100000, 100000)), env,
                                               run.parent_path() / "out.txt");
  REQUIRE(pid > 0);
  REQUIRE(test_support::wait_until([&] { return test_support::step_records(run) >= steps; }, 120s));
  return pid;
}

// Waits for a run started by started_long_run in DIR: its exit status and what it printed.
std::pair<int, std::string> ended(pid_t pid, const fs::path& dir) {
  const int code = test_support::wait_exit(pid);
  return {code, slurp(dir / "out.txt")};
}

}  // namespace

TEST_CASE("Ctrl-C: a message, a checkpoint at the next step boundary, exit 3; status calls it no crash") {
  const fs::path dir = fresh("sigint"), run = dir / "run";
  const pid_t pid = started_long_run(run, 3);
  ::kill(pid, SIGINT);
  const auto [code, out] = ended(pid, dir);
  INFO(out);
  REQUIRE(code == 3);
  CHECK(has(out, "Ctrl-C (SIGINT): finishing the step, then writing a checkpoint"));
  const std::string log = slurp(run / "log.rank0.txt");  // --quiet: the log file has the lines
  CHECK(has(log, "SIGINT (Ctrl-C) received: writing a checkpoint at step"));
  CHECK(has(log, "continue with `runner resume " + run.string() + "`"));
  // The checkpoint is the step the run stopped at, past the steps it had recorded.
  const std::string latest = slurp(run / "checkpoints" / "LATEST");
  int64_t step = -1;
  REQUIRE(runner::parse_checkpoint_file_name(latest.substr(0, latest.find('\n')), &step));
  CHECK(step >= 3);
  const nlohmann::json end = events(run).back();
  CHECK(end["event"] == "end");
  CHECK(end["cause"] == "preempted");
  CHECK(end["exit_code"] == 3);
  CHECK(end["signal"] == "SIGINT (Ctrl-C)");
  CHECK(end["step"] == step);
  const Result st = cli("status " + run.string());
  INFO(st.out);
  CHECK(st.code == 0);
  CHECK(has(st.out, "SIGINT"));
  CHECK_FALSE(has(st.out, "killed"));
  CHECK_FALSE(has(st.out, "crash"));
}

namespace {

// `RUNNER ARGS | tee LOG` (stderr too with `both`) started as a shell would, in a process group
// of its own: bash keeps the runner's exit status in RC (PIPESTATUS), its trap keeps it alive
// through the Ctrl-C it relays to the group, and tee, as on a terminal, dies of that Ctrl-C.
pid_t started_behind_tee(const fs::path& dir, const fs::path& run, bool both) {
  std::string args = tiny(run, 100000, 100000, "train.log_every=1");
  args.replace(args.find(" --quiet"), 8, "");  // progress lines on stdout, into the pipe
  const std::string cmd = "trap : INT; " + test_support::binary() + " " + args + (both ? " 2>&1" : " 2>" + (dir / "err.txt").string()) +
                          " | tee " + (dir / "tee.txt").string() + " >/dev/null; echo ${PIPESTATUS[0]} >" + (dir / "rc").string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setsid();  // the group a terminal's Ctrl-C reaches: bash, the runner and tee
    ::execl("/bin/bash", "bash", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  REQUIRE(pid > 0);
  REQUIRE(test_support::wait_until([&] { return test_support::step_records(run) >= 3; }, 120s));
  return pid;
}

}  // namespace

TEST_CASE("Ctrl-C to `runner train | tee`: tee dies first, the run still checkpoints and exits 3; the log file keeps every line") {
  for (const bool both : {false, true}) {
    CAPTURE(both);
    const fs::path dir = fresh(both ? "tee_both" : "tee"), run = dir / "run";
    const pid_t pid = started_behind_tee(dir, run, both);
    REQUIRE(::kill(-pid, SIGINT) == 0);
    test_support::wait_exit(pid);
    const std::string rc = slurp(dir / "rc"), log = slurp(run / "log.rank0.txt");
    INFO("exit status: " << rc << "\nlog:\n" << log << "\ntee got:\n" << slurp(dir / "tee.txt"));
    CHECK(std::stoi(rc) == 3);  // not 141 (SIGPIPE)
    const std::string latest = slurp(run / "checkpoints" / "LATEST");
    int64_t step = -1;
    REQUIRE(runner::parse_checkpoint_file_name(latest.substr(0, latest.find('\n')), &step));
    CHECK(step >= 3);
    const nlohmann::json end = events(run).back();
    CHECK(end["cause"] == "preempted");
    CHECK(end["exit_code"] == 3);
    CHECK(end["step"] == step);
    // The console stopped at the dead pipe; the file kept the lines after it.
    CHECK(has(log, "the console's output stream is closed"));
    CHECK(has(log, "SIGINT (Ctrl-C) received: writing a checkpoint at step " + std::to_string(step)));
    CHECK(has(log, "continue with `runner resume " + run.string() + "`"));
    const Result st = cli("status " + run.string());
    INFO(st.out);
    CHECK(has(st.out, "SIGINT"));
    CHECK_FALSE(has(st.out, "crash"));
  }
}

TEST_CASE("a second Ctrl-C exits at once (130), saying so") {
  const fs::path dir = fresh("sigint2"), run = dir / "run";
  // Each step sleeps 1.5 s more, so the second Ctrl-C lands inside the step the first one
  // waits for (two signals sent at once would merge into one).
  const pid_t pid = started_long_run(run, 1, {"RUNNER_FAULT_STEP_SLEEP_MS=1500"});
  ::kill(pid, SIGINT);
  CHECK(test_support::wait_until([&] { return has(slurp(dir / "out.txt"), "Ctrl-C (SIGINT)"); }, 10s));
  ::kill(pid, SIGINT);
  const auto [code, out] = ended(pid, dir);
  INFO(out);
  CHECK(code == 130);
  CHECK(has(out, "second Ctrl-C (SIGINT): exiting now, without a checkpoint"));
  CHECK_FALSE(fs::exists(run / "checkpoints" / "LATEST"));  // none was written: it exited mid-step
  // The run's end is recorded all the same: status says how it stopped, not "killed".
  const nlohmann::json end = events(run).back();
  CHECK(end["event"] == "end");
  CHECK(end["exit_code"] == 130);
  CHECK(end["signal"] == "SIGINT (Ctrl-C)");
  CHECK(end["step"].get<int64_t>() >= 1);
  const Result st = cli("status " + run.string());
  INFO(st.out);
  CHECK(has(st.out, "exited at once on a second signal"));
  CHECK_FALSE(has(st.out, "killed"));
}

TEST_CASE("a finished run: resume and train say it is done and how to extend it, and change nothing") {
  const fs::path run = fresh("finished") / "run";
  const std::string args = tiny(run, 10, 5);
  REQUIRE(cli(args).code == 0);
  const auto before = test_support::tree_bytes(run);
  REQUIRE(before.count("metrics.jsonl"));
  REQUIRE(before.count("checkpoints/step_00000010.h5"));

  for (const std::string& again : {"resume " + run.string(), args}) {
    CAPTURE(again);
    const Result r = cli(again);
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(has(r.out, "the run is finished: its last checkpoint is step 10 of train.steps 10"));
    CHECK(has(r.out, "nothing was changed"));
    CHECK(has(r.out, "runner resume " + run.string() + " --set train.steps=20"));
    CHECK_FALSE(has(r.out, "measured"));  // no ledger of a run of no steps
    CHECK(test_support::tree_bytes(run) == before);  // metrics.jsonl, its summary, checkpoints, logs: byte for byte
  }

  // The way the message gives: it continues to the new total and ends with a real summary.
  const Result more = cli("resume " + run.string() + " --quiet --set train.steps=15");
  INFO(more.out);
  REQUIRE(more.code == 0);
  const auto records = test_support::metrics_records(run);
  REQUIRE(!records.empty());
  const nlohmann::json& summary = records.back();
  REQUIRE(summary.contains("summary"));
  CHECK(summary["steps"] == 15);
  CHECK(summary["tokens_per_s"].get<double>() > 0);
}

TEST_CASE("a run stopped in its final evaluation: resume runs that evaluation, writes no summary of no steps, then is done") {
  const fs::path run = fresh("final_eval") / "run";
  REQUIRE(cli(tiny(run, 10, 5)).code == 0);
  // As a signal during the final evaluation leaves it: the checkpoint of step 10, the step
  // records, no final evaluation and no summary.
  std::string kept;
  for (const auto& j : test_support::metrics_records(run))
    if (!j.contains("summary") && !j.contains("eval")) kept += j.dump() + "\n";
  std::ofstream(run / "metrics.jsonl") << kept;
  const auto ckpts = test_support::tree_bytes(run / "checkpoints");

  const Result r = cli("resume " + run.string());
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(has(r.out, "running the final evaluation the last job did not finish"));
  const auto records = test_support::metrics_records(run);
  REQUIRE(!records.empty());
  CHECK(records.back().value("eval", false));
  CHECK(records.back()["step"] == 10);
  for (const auto& j : records) CHECK_FALSE(j.contains("summary"));
  CHECK(test_support::tree_bytes(run / "checkpoints") == ckpts);

  const auto before = test_support::tree_bytes(run);
  const Result again = cli("resume " + run.string());
  INFO(again.out);
  CHECK(again.code == 0);
  CHECK(has(again.out, "the run is finished"));
  CHECK(test_support::tree_bytes(run) == before);
}

TEST_CASE("relative recipe paths: inputs beside the recipe, outputs and --set in the working directory, stored absolute") {
  const fs::path dir = fresh("paths"), proj = dir / "proj", elsewhere = dir / "elsewhere", third = dir / "third";
  fs::create_directories(proj / "data");
  fs::create_directories(elsewhere);
  fs::create_directories(third);
  {
    std::ofstream text(proj / "data" / "corpus.txt");
    for (int i = 0; i < 2000; ++i) text << "the quick brown fox " << i << " jumps over the lazy dog.\n";
  }
  std::string recipe = slurp(test_support::quickstart_recipe());
  const size_t kind = recipe.find("kind: addition");
  REQUIRE(kind != std::string::npos);
  recipe.replace(kind, recipe.find("\n\n", kind) - kind, "kind: text\n  path: data/corpus.txt");
  std::ofstream(proj / "r.yaml") << recipe;

  // Trained from another directory, the data is found beside the recipe; --run-dir and the
  // checkpoints are where the working directory says.
  const std::string sets = " --quiet --run-dir run --set train.steps=6 train.eval_every=0 checkpoint.every_steps=3 "
                           "model.d_model=32 model.n_heads=2 model.seq_len=32 train.threads=1";
  const Result t = cli("train ../proj/r.yaml" + sets, elsewhere.string());
  INFO(t.out);
  REQUIRE(t.code == 0);
  const runner::Recipe stored = runner::load_recipe_text(slurp(elsewhere / "run" / "recipe.yaml"), "recipe.yaml");
  CHECK(stored.data.path == (proj / "data" / "corpus.txt").lexically_normal().string());

  // Resumed from a third directory: the stored recipe still finds the data.
  const Result r = cli("resume ../elsewhere/run --quiet --set train.steps=9", third.string());
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(test_support::metrics_records(elsewhere / "run").back()["steps"] == 9);

  // Unit level: what each kind of path is relative to.
  const fs::path cwd = fs::current_path();
  const runner::Recipe a = runner::load_recipe((proj / "r.yaml").string(), {"train.run_dir=runs/x"});
  CHECK(a.data.path == (proj / "data" / "corpus.txt").string());
  CHECK(a.train.run_dir == (cwd / "runs" / "x").string());
  const runner::Recipe b = runner::load_recipe((proj / "r.yaml").string(), {"data.path=mine.txt", "checkpoint.dir=ck"});
  CHECK(b.data.path == (cwd / "mine.txt").string());
  CHECK(b.checkpoint.dir == (cwd / "ck").string());
  // A recipe read from text (a stored one) keeps its own paths as written.
  CHECK(runner::load_recipe_text(recipe, "t.yaml").data.path == "data/corpus.txt");
}

TEST_CASE("a changed recipe on train: every changed field printed, recorded, the earlier recipe kept") {
  const fs::path run = fresh("changed") / "run";
  REQUIRE(cli(tiny(run, 10, 5)).code == 0);
  const std::string first_recipe = slurp(run / "recipe.yaml");

  // A refused change (the model's shape) stays refused and writes nothing, but says what changed.
  const auto before = test_support::tree_bytes(run);
  const Result refused = cli(tiny(run, 20, 5, "model.d_model=64"));
  INFO(refused.out);
  CHECK(refused.code == 2);
  CHECK(has(refused.out, "model.d_model 32 -> 64"));
  CHECK(has(refused.out, "the recipe's model differs"));
  CHECK_FALSE(fs::exists(run / "recipe.1.yaml"));
  CHECK(slurp(run / "recipe.yaml") == first_recipe);
  for (const auto& e : events(run)) CHECK(e["event"] != "recipe_changed");
  CHECK(test_support::tree_bytes(run).at("metrics.jsonl") == before.at("metrics.jsonl"));

  // An allowed change: each field printed (with --quiet too), recorded, the earlier recipe kept.
  const Result changed = cli(tiny(run, 20, 5, "optimizer.lr=5e-4"));
  INFO(changed.out);
  REQUIRE(changed.code == 0);
  CHECK(has(changed.out, "the recipe differs from the one this run ran with up to step 10 (its checkpoint's)"));
  CHECK(has(changed.out, "2 fields changed"));
  CHECK(has(changed.out, "optimizer.lr 0.001 -> 0.0005"));
  CHECK(has(changed.out, "train.steps 10 -> 20"));
  CHECK(slurp(run / "recipe.1.yaml") == first_recipe);
  CHECK(has(slurp(run / "recipe.yaml"), "lr: 0.0005"));
  nlohmann::json rec;
  for (const auto& e : events(run))
    if (e["event"] == "recipe_changed") rec = e;
  REQUIRE(rec.is_object());
  CHECK(rec["step"] == 10);
  CHECK(rec["earlier"] == "recipe.1.yaml");
  REQUIRE(rec["changes"].size() == 2);
  CHECK(rec["changes"][0] == nlohmann::json{{"field", "optimizer.lr"}, {"was", "0.001"}, {"now", "0.0005"}});
  // The checkpoints written after the change carry the changed recipe (a later resume keeps it).
  CHECK(has(runner::read_recipe_text((run / "checkpoints" / "step_00000020.h5").string()), "lr: 0.0005"));
  const Result resumed = cli("resume " + run.string() + " --quiet --set train.steps=25");
  INFO(resumed.out);
  CHECK(resumed.code == 0);
  CHECK_FALSE(has(resumed.out, "optimizer.lr"));  // only train.steps changed this time
  CHECK(has(resumed.out, "train.steps 20 -> 25"));
  CHECK(fs::exists(run / "recipe.2.yaml"));
}

TEST_CASE("resume --step back in history: the later records are kept in a copy, the later checkpoints named") {
  const fs::path run = fresh("step_back") / "run";
  REQUIRE(cli(tiny(run, 10, 5)).code == 0);
  const std::string first_metrics = slurp(run / "metrics.jsonl");
  const Result r = cli("resume " + run.string() + " --step 5 --quiet --set optimizer.lr=5e-4");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(has(r.out, "resuming from step 5, before this run's newest checkpoint (step 10)"));
  CHECK(has(r.out, "the file as it was is kept as " + run.string() + "/metrics.1.jsonl"));
  CHECK(has(r.out, "the checkpoint of step 10 is replaced when this run reaches it"));
  CHECK(slurp(run / "metrics.1.jsonl") == first_metrics);
  // The new path from step 5 is the file's now: steps 6..10 once each, and a summary.
  int step10 = 0;
  for (const auto& j : test_support::metrics_records(run)) step10 += j.contains("loss") && j.value("step", 0) == 10;
  CHECK(step10 == 1);
  CHECK(test_support::metrics_records(run).back().contains("summary"));
}

TEST_CASE("RUN_DIR/recipe.yaml edited by hand: resume says it runs the checkpoint's recipe, keeps the edit, shows the --set") {
  const fs::path run = fresh("edited") / "run";
  REQUIRE(cli(tiny(run, 10, 5)).code == 0);
  const std::string original = slurp(run / "recipe.yaml");
  std::string edited = original;
  const size_t at = edited.find("lr: 0.001\n");
  REQUIRE(at != std::string::npos);
  edited.replace(at, 10, "lr: 0.0005\n");
  std::ofstream(run / "recipe.yaml") << edited;

  const Result r = cli("resume " + run.string() + " --quiet --set train.steps=12");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(has(r.out, run.string() + "/recipe.yaml differs from the recipe this job runs"));
  CHECK(has(r.out, "optimizer.lr 0.001 <- 0.0005"));
  CHECK(has(r.out, "runner resume " + run.string() + " --set optimizer.lr=0.0005 train.steps=10"));
  // The edit is kept, not lost; what the checkpoint ran with before the --set is kept too.
  CHECK(slurp(run / "recipe.1.yaml") == original);
  CHECK(slurp(run / "recipe.2.yaml") == edited);
  CHECK(has(slurp(run / "recipe.yaml"), "lr: 0.001\n"));
}

TEST_CASE("recipe_changes: values, lists, fields added and gone") {
  const auto c = runner::recipe_changes("a:\n  x: 1\n  l: [1, 2]\n  gone: 3\nb: s\n", "a:\n  x: 2\n  l: [1, 3]\nb: s\nc: new\n");
  REQUIRE(c.size() == 4);
  CHECK(runner::describe_change(c[0]) == "a.x 1 -> 2");
  CHECK(runner::describe_change(c[1]) == "a.l [1, 2] -> [1, 3]");
  CHECK(runner::describe_change(c[2]) == "c (unset) -> new");
  CHECK(runner::describe_change(c[3]) == "a.gone 3 -> (unset)");
  CHECK(runner::recipe_changes("a: 1\n", "a: 1\n").empty());
}

TEST_CASE("resume while another runner owns the directory before its first checkpoint: the owner is named") {
  const fs::path run = fresh("owned") / "run";
  {
    test_support::HeldRunLock held(run, "host testhost pid 4242 since 2026-12-03T12:00:00Z");
    const Result r = cli("resume " + run.string());
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(has(r.out, "is in use by another runner (host testhost pid 4242 since 2026-12-03T12:00:00Z)"));
    CHECK_FALSE(has(r.out, "no checkpoint"));
  }
  // Once the owner is gone: no checkpoint, and how to start again.
  const Result r = cli("resume " + run.string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "no checkpoint to resume from"));
}

TEST_CASE("resume on a directory that is not a run: says so, as status does, and leaves nothing behind") {
  const fs::path dir = fresh("not_a_run");
  fs::create_directories(dir / "empty");
  fs::create_directories(dir / "notes");
  std::ofstream(dir / "notes" / "todo.txt") << "not a run\n";
  for (const fs::path& d : {dir / "empty", dir / "notes"}) {
    CAPTURE(d);
    const auto before = test_support::tree_bytes(d);
    const Result r = cli("resume " + d.string());
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(has(r.out, "not a run directory"));
    CHECK_FALSE(has(r.out, "stopped before its first checkpoint"));
    CHECK(test_support::tree_bytes(d) == before);
    CHECK_FALSE(fs::exists(d / "runner.lock"));
    const Result st = cli("status " + d.string());
    CHECK(has(st.out, "not a run directory"));
  }
}
