// Automatic restart under Slurm, without a cluster: the policy's decisions (each
// cause, the limit, the same-step rule, scancel, exit 2, exit 3 not counted, the backoff
// doubling), the start-up judging of an attempt Slurm requeued by itself, node changes, host
// lists, the --elastic node range from the memory ledger, the generated script's restart call
// run with fake srun/scontrol, and `runner status` showing the records. tests/slurm/ runs it on
// real clusters.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/recipe/recipe.h"
#include "runner/run/restart.h"
#include "runner/run/slurm.h"
#include "tests/support/env.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;
using nlohmann::json;
using test_support::Result;
using test_support::runner_cmd;
using test_support::sh;
using A = RestartDecision::Action;

namespace {

const std::string kTiny = std::string(RUNNER_TEST_DIR) + "/slurm/tiny.yaml";

SlurmEnv job(const std::string& id, int64_t restart_count = 0, const std::string& nodes = "n[1-2]", int64_t nnodes = 2) {
  return SlurmEnv{.in_job = true, .job_id = id, .node_list = nodes, .restart_count = restart_count, .nnodes = nnodes};
}

json start_record(const std::string& id, int64_t restart_count, const std::string& nodes, int64_t nnodes,
                  int64_t resumed_from = -1) {
  return {{"event", "start"}, {"resumed_from", resumed_from},
          {"slurm", {{"job_id", id}, {"restart_count", restart_count}, {"node_list", nodes}, {"nnodes", nnodes}}}};
}

RunHistory history(std::vector<json> events, int64_t step, int64_t ckpt) {
  RunHistory h;
  h.events = std::move(events);
  h.step_reached = step;
  h.checkpoint = ckpt;
  return h;
}

AttemptOutcome failed(int srun_code, std::vector<int> ranks = {}, std::string state = "RUNNING") {
  AttemptOutcome o;
  o.srun_code = srun_code;
  o.rank_codes = std::move(ranks);
  o.job_state = std::move(state);
  return o;
}

}  // namespace

TEST_CASE("restart policy: which failures are restarted, and which never") {
  const RestartPolicy p{3, 30};
  const RunHistory h = history({start_record("7", 0, "n[1-2]", 2, 20)}, 37, 20);
  const SlurmEnv env = job("7");
  // A rank's crash (exit 1), a signal death (SIGKILL: 137), the watchdog's hang (exit 5): restarted.
  RestartDecision d = decide_after_attempt(h, p, failed(1), env);
  CHECK(d.action == A::restart);
  CHECK(d.backoff_s == 30);
  CHECK(d.record["event"] == "restart");
  CHECK(d.record["cause"] == "a rank or srun failed (exit 1)");
  CHECK(d.record["attempt"] == 1);
  CHECK(d.record["max_restarts"] == 3);
  CHECK(d.record["step"] == 37);
  CHECK(d.record["checkpoint"] == 20);
  CHECK(d.record["nodes"] == json({"n1", "n2"}));
  CHECK(d.message.find("restart 1 of 3 after 30 s") != std::string::npos);
  d = decide_after_attempt(h, p, failed(137), env);
  CHECK(d.action == A::restart);
  CHECK(d.record["cause"] == "a rank killed by SIGKILL (exit 137)");
  // srun reports the peers' SIGTERM (143); the rank's own record says the watchdog stopped it.
  d = decide_after_attempt(h, p, failed(143, {5}), env);
  CHECK(d.action == A::restart);
  CHECK(d.record["exit_code"] == 5);
  CHECK(d.record["cause"].get<std::string>().find("hang") != std::string::npos);
  // A node Slurm has down: named as lost.
  AttemptOutcome lost = failed(1);
  lost.nodes_down = down_nodes("n1 allocated;n2 down*;n3 idle");
  d = decide_after_attempt(h, p, lost, env);
  CHECK(d.action == A::restart);
  CHECK(d.record["nodes_lost"] == json({"n2"}));
  CHECK(d.record["cause"].get<std::string>().rfind("node lost (n2)", 0) == 0);

  // Never: exit 2 (even hidden behind a peer's SIGTERM), scancel (state or the shell's SIGTERM),
  // the time limit, the numerics stop; recorded as refusals that do not count.
  for (const AttemptOutcome& o : {failed(2), failed(143, {2}), failed(1, {}, "CANCELLED"), failed(1, {}, "TIMEOUT"),
                                  failed(4)}) {
    d = decide_after_attempt(h, p, o, env);
    CAPTURE(d.message);
    CHECK(d.action == A::refuse);
    CHECK(d.record["event"] == "no_restart");
    CHECK(d.record["counted"] == false);
  }
  AttemptOutcome term = failed(143);
  term.term_signal = true;
  d = decide_after_attempt(h, p, term, env);
  CHECK(d.action == A::refuse);
  CHECK(d.record["cause"] == "cancelled (scancel)");
  CHECK(decide_after_attempt(h, p, failed(143, {2}), env).record["cause"].get<std::string>().find("user error") !=
        std::string::npos);
  // Exit 3 is the preemption path (the script requeues it; not a failure); 0 finished; Slurm's
  // own requeue after a node failure is recorded at the next start; a start-up refusal said it already.
  CHECK(decide_after_attempt(h, p, failed(3), env).action == A::none);
  CHECK(decide_after_attempt(h, p, failed(3), env).record.is_null());
  CHECK(decide_after_attempt(h, p, failed(0), env).action == A::none);
  CHECK(decide_after_attempt(h, p, failed(1, {}, "NODE_FAIL"), env).action == A::slurm_requeues);
  CHECK(decide_after_attempt(h, p, failed(1, {}, "REQUEUED"), env).record.is_null());
  CHECK(decide_after_attempt(h, p, failed(143, {kExitNoRestart}), env).action == A::none);
}

TEST_CASE("restart policy: the limit per Slurm job, the backoff doubling, the same-step rule, preemptions not counted") {
  const RestartPolicy p{3, 30};
  const SlurmEnv env = job("7");
  std::vector<json> ev{start_record("7", 0, "n[1-2]", 2)};
  CHECK(restart_backoff(p, 1) == 30);
  CHECK(restart_backoff(p, 2) == 60);
  CHECK(restart_backoff(p, 3) == 120);
  // Three failures at different steps, a preemption (end record, exit 3) between them: restarts 1..3
  // with the backoff doubling; the preemption counts for nothing.
  const int64_t steps[] = {25, 47, 66, 90};
  for (int i = 0; i < 4; ++i) {
    RestartDecision d = decide_after_attempt(history(ev, steps[i], steps[i] / 20 * 20), p, failed(137), env);
    CAPTURE(i);
    if (i < 3) {
      REQUIRE(d.action == A::restart);
      CHECK(d.record["attempt"] == i + 1);
      CHECK(d.backoff_s == 30.0 * (1 << i));
    } else {
      CHECK(d.action == A::refuse);
      CHECK(d.record["reason"] == "limit");
      CHECK(d.message.find("the limit of 3 restarts (train.max_restarts) is reached") != std::string::npos);
    }
    ev.push_back(d.record);
    ev.push_back(start_record("7", i + 1, "n[1-2]", 2));
    if (i == 0) {
      ev.push_back({{"event", "end"}, {"cause", "preempted"}, {"exit_code", 3}, {"step", 40}});
      ev.push_back(start_record("7", 2, "n[1-2]", 2));
    }
  }
  // Another job on the run (a resubmission) starts with a fresh count; a scancel refusal counts not.
  ev.push_back({{"event", "no_restart"}, {"counted", false}, {"job_id", "8"}, {"step", 91}, {"checkpoint", 80}});
  CHECK(decide_after_attempt(history(ev, 95, 80), p, failed(1), job("8")).record["attempt"] == 1);
  // train.max_restarts 0: none.
  CHECK(decide_after_attempt(history({}, 5, -1), RestartPolicy{0, 30}, failed(1), env).record["reason"] == "limit");

  // The same step twice in a row (same step reached, same checkpoint): stops, says so.
  std::vector<json> same{start_record("9", 0, "n1", 1)};
  RestartDecision d = decide_after_attempt(history(same, 137, 120), p, failed(1), job("9"));
  REQUIRE(d.action == A::restart);
  same.push_back(d.record);
  same.push_back(start_record("9", 1, "n1", 1, 120));
  d = decide_after_attempt(history(same, 137, 120), p, failed(1), job("9"));
  CHECK(d.action == A::refuse);
  CHECK(d.record["reason"] == "same step");
  CHECK(d.message.find("failed again at step 137 with no progress") != std::string::npos);
  // Progress since (a later step): restarted.
  CHECK(decide_after_attempt(history(same, 139, 120), p, failed(1), job("9")).action == A::restart);
}

TEST_CASE("one failure, one decision: a check asked twice counts once; a launch that never started is no 'same step'") {
  const RestartPolicy p{3, 1};
  // A hang at step 70 (checkpoint 60), with the hang's records from two ranks.
  std::vector<json> ev{start_record("5", 0, "n[1-2]", 2, 60)};
  for (int rank : {1, 0}) {
    ev.push_back({{"event", "hang"}, {"rank", rank}, {"step", 70}});
    ev.push_back({{"event", "end"}, {"cause", "hang"}, {"exit_code", kExitHang}, {"step", 70}});
  }
  RestartDecision d = decide_after_attempt(history(ev, 70, 60), p, failed(139), job("5", 0));
  REQUIRE(d.action == A::restart);
  CHECK(d.record["attempt"] == 1);
  ev.push_back(d.record);
  // The same attempt judged again: the same answer, no record, nothing counted.
  RestartDecision again = decide_after_attempt(history(ev, 70, 60), p, failed(139), job("5", 0));
  CHECK(again.action == A::restart);
  CHECK(again.record.is_null());
  // The requeued attempt's ranks never started (srun could not launch them while the last
  // step's were being torn down): no start record, still at step 70. A failure, counted, but
  // not "failed again at the same step": the run did not run.
  d = decide_after_attempt(history(ev, 70, 60), p, failed(1), job("5", 1));
  REQUIRE(d.action == A::restart);
  CHECK(d.record["attempt"] == 2);
  ev.push_back(d.record);
  // It starts, then fails at step 70 again: now that is the same step.
  ev.push_back(start_record("5", 2, "n[1-2]", 2, 60));
  d = decide_after_attempt(history(ev, 70, 60), p, failed(1), job("5", 2));
  CHECK(d.action == A::refuse);
  CHECK(d.record["reason"] == "same step");
}

TEST_CASE("at start: an attempt that vanished (Slurm's own requeue after a node failure) is judged and recorded") {
  const RestartPolicy p{2, 30};
  std::vector<json> ev{start_record("7", 0, "n[1-2]", 2, -1)};
  // Slurm requeued job 7 (restart count 0 -> 1) onto n1 alone: a restart, n2 lost, the backoff
  // left after the 10 s since the last record.
  RunHistory h = history(ev, 50, 40);
  h.last_activity = 1000;
  RestartDecision d = decide_at_start(h, p, job("7", 1, "n1", 1), 1010);
  REQUIRE(d.action == A::restart);
  CHECK(d.record["detected"] == "at start");
  CHECK(d.record["nodes_lost"] == json({"n2"}));
  CHECK(d.record["nodes"] == json({"n1", "n2"}));
  CHECK(d.backoff_s == 20);
  CHECK(d.record["backoff_full_s"] == 30);
  CHECK(d.record["cause"].get<std::string>().find("restart count 0 -> 1") != std::string::npos);
  // Past the backoff: nothing left to wait.
  CHECK(decide_at_start(h, p, job("7", 1, "n1", 1), 2000).backoff_s == 0);
  // Not a vanished attempt: its end recorded, the script's restart recorded, another job, the same restart count.
  for (const json& after : {json{{"event", "end"}, {"cause", "preempted"}}, json{{"event", "restart"}}}) {
    std::vector<json> e2 = ev;
    e2.push_back(after);
    CHECK(decide_at_start(history(e2, 50, 40), p, job("7", 1), 1010).action == A::none);
  }
  CHECK(decide_at_start(h, p, job("8", 0), 1010).action == A::none);
  CHECK(decide_at_start(h, p, job("7", 0), 1010).action == A::none);
  CHECK(decide_at_start(h, p, SlurmEnv{}, 1010).action == A::none);
  // The same limit: a third vanished attempt of job 7 is refused.
  ev.push_back(d.record);
  ev.push_back(start_record("7", 1, "n1", 1, 40));
  d = decide_at_start(history(ev, 61, 60), p, job("7", 2, "n1", 1), 1010);
  REQUIRE(d.action == A::restart);
  ev.push_back(d.record);
  ev.push_back(start_record("7", 2, "n1", 1, 60));
  d = decide_at_start(history(ev, 85, 80), p, job("7", 3, "n1", 1), 1010);
  CHECK(d.action == A::refuse);
  CHECK(d.record["reason"] == "limit");

  // A change of nodes since the last start: shrink, then grow.
  json c = node_change_record(history({start_record("7", 0, "n[1-2]", 2)}, 0, 0), job("7", 1, "n1", 1));
  CHECK(c["event"] == "shrink");
  CHECK(c["nodes_lost"] == json({"n2"}));
  c = node_change_record(history({start_record("7", 1, "n1", 1)}, 0, 0), job("7", 2, "n[1-2]", 2));
  CHECK(c["event"] == "grow");
  CHECK(c["nodes_added"] == json({"n2"}));
  CHECK(node_change_record(history({start_record("7", 1, "n1", 1)}, 0, 0), job("7", 2, "n2", 1)).is_null());
}

TEST_CASE("host lists, node states and the ranks' exit records") {
  CHECK(expand_hostlist("n[1-3,5],login") == std::vector<std::string>{"n1", "n2", "n3", "n5", "login"});
  CHECK(expand_hostlist("node[01-02]") == std::vector<std::string>{"node01", "node02"});
  CHECK(expand_hostlist("localhost") == std::vector<std::string>{"localhost"});
  CHECK(expand_hostlist("").empty());
  CHECK(down_nodes("a idle\nb down\nc mixed*\nd drained\ne allocated\n") == std::vector<std::string>{"b", "c", "d"});
  const fs::path d = test_support::fresh_dir("restart", "exits");
  const std::string f = (d / "exits").string();
  {
    test_support::ScopedEnv record("RUNNER_EXIT_RECORD", f);
    test_support::ScopedEnv rank("SLURM_PROCID", "1");
    record_rank_exit(0);  // success leaves no line
    record_rank_exit(5);
  }
  record_rank_exit(2);  // without the script's variable: nothing
  CHECK(read_rank_exits(f) == std::vector<int>{5});
}

TEST_CASE("--elastic: --nodes=MIN-MAX with MIN from the memory ledger and tp x pp; the run history from the files") {
  // tiny at 1 rank per node, dp 2: fits on 1 node.
  Recipe r = load_recipe(kTiny, {"hardware.devices_per_node=1"});
  CHECK(min_elastic_nodes(r, 1, 2) == 1);
  // tp 2 at 1 rank per node: never fewer than 2 nodes (dp 2 x tp 2 on 4 nodes -> MIN 2).
  r = load_recipe(kTiny, {"hardware.devices_per_node=1", "parallel.tp=2"});
  CHECK(min_elastic_nodes(r, 1, 4) == 2);
  // A model the ledger fits only with its optimizer state spread over dp 8 (ZeRO-1): MIN > 1.
  r = load_recipe(kTiny, {"hardware.devices_per_node=1", "parallel.dp=8", "batch.global=32", "model.d_model=4096",
                          "model.n_layers=32", "model.n_heads=32", "hardware.device=h100-80gb", "parallel.zero=1"});
  const int64_t m = min_elastic_nodes(r, 1, 8);
  CHECK(m == 4);  // `runner plan` of this: dp 4 fits (83%), dp 2 does not (106%), dp 3 does not divide the batch
  Recipe e = r;
  e.parallel.dp = 0;
  e.batch.accum = 0;
  CHECK(make_plan(e, m).fits);
  for (int64_t n = 1; n < m; ++n) {
    CAPTURE(n);
    bool fits = false;
    try {
      fits = make_plan(e, n).fits;
    } catch (const UserError&) {
    }
    CHECK(!fits);
  }

  // read_run_history: events, the last step of metrics.jsonl, LATEST.
  const fs::path d = test_support::fresh_dir("restart", "history");
  fs::create_directories(d / "checkpoints");
  std::ofstream(d / "events.jsonl") << R"({"event":"start","resumed_from":-1})" << "\n";
  std::ofstream(d / "metrics.jsonl") << R"({"step":1,"loss":5.0,"step_ms":3})" << "\n"
                                     << R"({"step":2,"loss":4.0,"step_ms":3})" << "\n{torn";
  std::ofstream(d / "checkpoints" / "LATEST") << "step_00000002.h5";
  const RunHistory h = read_run_history(d.string(), (d / "checkpoints").string());
  CHECK(h.events.size() == 1);
  CHECK(h.step_reached == 2);
  CHECK(h.checkpoint == 2);
  CHECK(h.last_activity > 0);
}

// The job script `runner launch --slurm --dry-run` writes for tiny.yaml with `sets` and the run
// directory D/run, saved as D/job.sbatch; D/bin (for the fake Slurm commands) and D/run made.
// Returns the script's text.
std::string write_job_script(const fs::path& d, const std::string& sets) {
  Result r = runner_cmd("launch " + kTiny + " --slurm --dry-run --run-dir " + (d / "run").string() + " " + sets);
  REQUIRE(r.code == 0);
  std::ofstream(d / "job.sbatch") << r.out;
  fs::create_directories(d / "bin");
  fs::create_directories(d / "run");
  return r.out;
}

// The fake scontrol (logs its calls to $FAKE_LOG; the job RUNNING) and sinfo (one mixed node)
// beside a test's own fake srun in BIN, all executable.
void write_fake_scontrol_sinfo(const fs::path& bin) {
  std::ofstream(bin / "scontrol") << "#!/bin/bash\necho \"$*\" >>\"$FAKE_LOG\"\n"
                                     "[ \"$1\" = show ] && printf '   JobState=RUNNING Reason=None\\n'\nexit 0\n";
  std::ofstream(bin / "sinfo") << "#!/bin/bash\nprintf 'localhost mixed\\n'\n";
  for (const char* b : {"srun", "scontrol", "sinfo"}) fs::permissions(bin / b, fs::perms::owner_all);
}

// The generated script run for real with fake srun, scontrol and sinfo on PATH: a failure calls
// `runner restart-check`, which records it; the job is requeued to start after the backoff (not
// held idle); exit 2 behind a peer's signal, scancel and a repeat at the same step are not.
TEST_CASE("the sbatch script asks the runner after a failure, requeues with StartTime=now+backoff, and records it") {
  const fs::path d = test_support::fresh_dir("restart", "script");
  const fs::path run = d / "run";
  const std::string text = write_job_script(d, "--set train.restart_backoff=7 --set train.max_restarts=2");
  CHECK(text.find("restart-check \"$RECIPE\" --run-dir \"$RUN_DIR\" --set train.restart_backoff=7 --set "
                  "train.max_restarts=2 --exit-code \"$rc\"") != std::string::npos);
  const fs::path script = d / "job.sbatch", bin = d / "bin";
  std::ofstream(bin / "srun") << "#!/bin/bash\n[ \"$FAKE_TERM\" = 1 ] && kill -TERM $PPID\n"
                                 "[ -n \"$FAKE_RANK\" ] && echo \"0 $FAKE_RANK\" >>\"$RUNNER_EXIT_RECORD\"\nexit \"$FAKE_RC\"\n";
  write_fake_scontrol_sinfo(bin);
  std::ofstream(run / "events.jsonl") << start_record("41", 0, "localhost", 1, -1).dump() << "\n";
  std::ofstream(run / "metrics.jsonl") << R"({"step":13,"loss":5.0,"step_ms":3})" << "\n";
  const fs::path log = d / "scontrol.log";
  std::string restart_count = "0";  // SLURM_RESTART_COUNT: each requeue of the job adds one
  auto go = [&](const std::string& rc, const std::string& rank, const std::string& term) {
    fs::remove(log);
    Result res = sh("PATH=" + bin.string() + ":$PATH SLURM_JOB_ID=41 SLURM_RESTART_COUNT=" + restart_count +
                    " SLURM_NTASKS=2 FAKE_RC=" + rc + " FAKE_RANK=" + rank +
                    " FAKE_TERM=" + term + " FAKE_LOG=" + log.string() + " bash " + script.string());
    std::ifstream in(log);
    return std::make_pair(res, std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  };
  auto [res, calls] = go("1", "", "0");
  CAPTURE(res.out);
  CHECK(res.code == 1);
  CHECK(calls.find("requeue 41\nupdate JobId=41 StartTime=now+7\n") != std::string::npos);
  CHECK(res.out.find("restart 1 of 2 after 7 s: a rank or srun failed (exit 1) (step 13, no checkpoint yet)") !=
        std::string::npos);
  // Exit 2 of rank 0 behind srun's 143 (its peer SIGTERMed), and scancel: recorded, not requeued.
  for (auto [rc, rank, term] : {std::tuple{"143", "2", "0"}, std::tuple{"143", "", "1"}}) {
    auto [res2, calls2] = go(rc, rank, term);
    CAPTURE(res2.out);
    CHECK(calls2.find("requeue") == std::string::npos);
    CHECK(res2.out.find("no restart: ") != std::string::npos);
  }
  // Requeued, started again, failed at the same step with no new records: the same-step rule stops it.
  restart_count = "1";
  std::ofstream(run / "events.jsonl", std::ios::app) << start_record("41", 1, "localhost", 1, -1).dump() << "\n";
  std::tie(res, calls) = go("137", "", "0");
  CHECK(calls.find("requeue") == std::string::npos);
  CHECK(res.out.find("failed again at step 13 with no progress") != std::string::npos);
  // All of it in events.jsonl, and `runner status` shows it.
  std::ofstream(run / "recipe.yaml") << "name: slurm-tiny\ntrain:\n  steps: 600\n";
  Result st = runner_cmd("status " + run.string());
  CAPTURE(st.out);
  CHECK(st.out.find("restart 1 of 2 pending (7 s backoff): a rank or srun failed (exit 1)") == std::string::npos);
  CHECK(st.out.find("restarts stopped: a rank killed by SIGKILL (exit 137) at step 13 (failed again at the same step with "
                    "no progress)") != std::string::npos);
  Result js = runner_cmd("status " + run.string() + " --json");
  const json s = json::parse(js.out);
  CHECK(s["restarts_stopped"]["reason"] == "same step");
}

// A requeued job's step has the previous attempt's id; while that one is still being torn down,
// srun cannot launch the ranks, says "launch failed" in the job's output and may return 0. The
// script tries again (a fake srun failing the first FAKE_FAILS launches), and after 3 failed
// tries it is a failure the runner judges.
TEST_CASE("the sbatch script tries a launch again that failed because the previous step was still ending") {
  const fs::path d = test_support::fresh_dir("restart", "relaunch");
  const fs::path run = d / "run";
  write_job_script(d, "--set train.restart_backoff=5");
  const fs::path script = d / "job.sbatch", bin = d / "bin", count = d / "launches";
  // Each call counts itself; the first FAKE_FAILS write srun's launch error to the job's output.
  std::ofstream(bin / "srun") << "#!/bin/bash\necho x >>\"$FAKE_COUNT\"\n"
                                 "if [ \"$(wc -l <\"$FAKE_COUNT\")\" -le \"$FAKE_FAILS\" ]; then\n"
                                 "  echo 'srun: error: task 0 launch failed: Unspecified error' >>\"$FAKE_OUT\"\nfi\nexit 0\n";
  write_fake_scontrol_sinfo(bin);
  std::ofstream(run / "events.jsonl") << start_record("42", 0, "localhost", 1, -1).dump() << "\n";
  std::ofstream(run / "metrics.jsonl") << R"({"step":13,"loss":5.0,"step_ms":3})" << "\n";
  const fs::path log = d / "scontrol.log", out = run / "slurm-42.out";
  auto go = [&](int fails) {
    fs::remove(log);
    fs::remove(count);
    fs::remove(out);
    Result res = sh("PATH=" + bin.string() + ":$PATH SLURM_JOB_ID=42 SLURM_NTASKS=2 FAKE_FAILS=" + std::to_string(fails) +
                    " FAKE_COUNT=" + count.string() + " FAKE_OUT=" + out.string() + " FAKE_LOG=" + log.string() +
                    " bash " + script.string());
    std::ifstream in(log);
    const std::string calls((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return std::make_tuple(res, calls, static_cast<int>(test_support::slurp(count).size() / 2));
  };
  // One failed launch, then the ranks run: exit 0, no requeue, two launches.
  auto [res, calls, launches] = go(1);
  CAPTURE(res.out);
  CHECK(res.code == 0);
  CHECK(launches == 2);
  CHECK(res.out.find("srun could not launch the ranks (try 1 of 3") != std::string::npos);
  CHECK(calls.find("requeue") == std::string::npos);
  // Every launch fails: after 3 tries a failure (exit 1), which the runner restarts.
  std::tie(res, calls, launches) = go(5);
  CAPTURE(res.out);
  CHECK(launches == 3);
  CHECK(res.code == 1);
  CHECK(calls.find("requeue 42\nupdate JobId=42 StartTime=now+5\n") != std::string::npos);
}

TEST_CASE("runner status: per restart its cause, the nodes it had and lost, the step reached, and node changes") {
  const fs::path d = test_support::fresh_dir("restart", "status");
  std::ofstream(d / "recipe.yaml") << "name: slurm-tiny\ntrain:\n  steps: 600\n";
  const RestartDecision r1 = decide_at_start(history({start_record("7", 0, "n[1-2]", 2, -1)}, 50, 40), RestartPolicy{},
                                             job("7", 1, "n1", 1), 0);
  REQUIRE(r1.action == A::restart);
  std::ofstream(d / "events.jsonl") << start_record("7", 0, "n[1-2]", 2, -1).dump() << "\n"
                                    << r1.record.dump() << "\n"
                                    << node_change_record(history({start_record("7", 0, "n[1-2]", 2)}, 0, 40),
                                                          job("7", 1, "n1", 1)).dump() << "\n"
                                    << start_record("7", 1, "n1", 1, 40).dump() << "\n";
  Result st = runner_cmd("status " + d.string());
  CAPTURE(st.out);
  CHECK(st.out.find("automatic restart 1 of 3 after 30 s backoff (at start): step 50 reached, checkpoint 40; nodes had: "
                    "n1 n2; lost: n2") != std::string::npos);
  CHECK(st.out.find("shrank from 2 to 1 node(s): n1") != std::string::npos);
  const json s = json::parse(runner_cmd("status " + d.string() + " --json").out);
  REQUIRE(s["restarts"].size() == 1);
  CHECK(s["restarts"][0]["nodes_lost"] == json({"n2"}));
  CHECK(s["restarts"][0]["step"] == 50);
  CHECK(s["restarts"][0]["automatic"] == true);
}

// `runner train` itself, in a (faked) Slurm job that Slurm requeued after its previous attempt
// vanished: the restart is judged at start, before anything is built.
TEST_CASE("runner train after Slurm's own requeue: records the restart (or refuses with exit 6) and a shrink") {
  const fs::path d = test_support::fresh_dir("restart", "train");
  const std::string env = "SLURM_JOB_ID=77 SLURM_RESTART_COUNT=1 SLURM_JOB_NODELIST=n1 SLURM_JOB_NUM_NODES=1 SLURM_NTASKS=1 "
                          "OMP_NUM_THREADS=1 ";
  const std::string args = "train " + kTiny + " --quiet --set parallel.dp=1 --set train.steps=2 --set checkpoint.every_steps=1 "
                           "--set train.restart_backoff=0 --run-dir ";
  auto events = [](const fs::path& run) {
    std::vector<json> out;
    std::ifstream in(run / "events.jsonl");
    for (std::string l; std::getline(in, l);) out.push_back(json::parse(l));
    return out;
  };
  // train.max_restarts 0: refused, exit 6 (the script does not requeue it), said and recorded.
  fs::create_directories(d / "a");
  std::ofstream(d / "a" / "events.jsonl") << start_record("77", 0, "n[1-2]", 2).dump() << "\n";
  Result r = sh(env + test_support::binary() + " " + args + (d / "a").string() + " --set train.max_restarts=0 2>&1");
  CAPTURE(r.out);
  CHECK(r.code == kExitNoRestart);
  CHECK(r.out.find("no restart: the previous attempt vanished without a stop record and Slurm requeued the job (restart "
                   "count 0 -> 1): a node failure (n2 not in this allocation)") != std::string::npos);
  std::vector<json> ev = events(d / "a");
  REQUIRE(ev.size() >= 2);
  CHECK(ev[1]["event"] == "no_restart");
  CHECK(ev[1]["reason"] == "limit");
  CHECK(!fs::exists(d / "a" / "checkpoints"));
  // Restarts allowed: recorded, the shrink from 2 nodes to 1 recorded, then the run's own start and end.
  fs::create_directories(d / "b");
  std::ofstream(d / "b" / "events.jsonl") << start_record("77", 0, "n[1-2]", 2).dump() << "\n";
  r = sh(env + test_support::binary() + " " + args + (d / "b").string() + " 2>&1");
  CAPTURE(r.out);
  CHECK(r.code == 0);
  ev = events(d / "b");
  std::string kinds;
  for (const json& e : ev)  // the watchdog's record (its timeout) is not this test's business
    if (e["event"] != "watchdog") kinds += e["event"].get<std::string>() + " ";
  CHECK(kinds == "start restart shrink start end ");
  CHECK(ev[1]["detected"] == "at start");
  CHECK(ev[1]["nodes_lost"] == json({"n2"}));
  CHECK(ev[2]["nodes_now"] == 1);
}

// Growing back, with fakes: a job on 1 of its 2 nodes sees an idle node and tells its ranks to
// checkpoint and exit 3 (scancel --signal=USR1, to the steps); on its full 2 nodes it does not look.
TEST_CASE("--elastic: the batch script's grow-back check signals the ranks once a node is idle") {
  const fs::path d = test_support::fresh_dir("restart", "grow");
  Result r = runner_cmd("launch " + kTiny + " --slurm --elastic --dry-run --set hardware.devices_per_node=1 --run-dir " +
                        (d / "run").string());
  REQUIRE(r.code == 0);
  const fs::path script = d / "job.sbatch", bin = d / "bin";
  std::ofstream(script) << r.out;
  fs::create_directories(bin);
  // srun: "trains" until the USR1 check had time; exits 3 as the ranks would after the signal.
  std::ofstream(bin / "srun") << "#!/bin/bash\nfor i in $(seq 30); do [ -s \"$FAKE_LOG\" ] && exit 3; sleep 0.1; done\nexit 0\n";
  std::ofstream(bin / "scancel") << "#!/bin/bash\necho \"scancel $*\" >>\"$FAKE_LOG\"\n";
  std::ofstream(bin / "scontrol") << "#!/bin/bash\n[ \"$1\" = show ] && printf '   JobState=RUNNING\\n'\nexit 0\n";
  std::ofstream(bin / "sinfo") << "#!/bin/bash\necho 1\n";  // `sinfo -t idle -o %D`: one idle node
  for (const char* b : {"srun", "scancel", "scontrol", "sinfo"}) fs::permissions(bin / b, fs::perms::owner_all);
  for (const char* nodes : {"1", "2"}) {
    CAPTURE(nodes);
    const fs::path log = d / (std::string("scancel.") + nodes);
    Result run = sh("PATH=" + bin.string() + ":$PATH SLURM_JOB_ID=41 SLURM_JOB_NUM_NODES=" + nodes +
                    " RUNNER_GROW_POLL=0.2 FAKE_LOG=" + log.string() + " bash " + script.string());
    CAPTURE(run.out);
    std::ifstream in(log);
    const std::string calls((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (std::string(nodes) == "1") {
      CHECK(calls == "scancel --signal=USR1 41\n");
      CHECK(run.out.find("1 idle node(s) beside this job's 1: growing back") != std::string::npos);
      CHECK(run.out.find("preempted at a checkpoint; requeueing job 41") != std::string::npos);
    } else {
      CHECK(calls.empty());
    }
  }
}

TEST_CASE("runner status: a restart before the first checkpoint says the run started over, not 'step -1'") {
  const fs::path d = test_support::fresh_dir("restart", "status_nockpt");
  std::ofstream(d / "recipe.yaml") << "name: slurm-tiny\ntrain:\n  steps: 600\n";
  const RestartDecision r1 = decide_at_start(history({start_record("8", 0, "n[1-2]", 2, -1)}, 20, -1), RestartPolicy{},
                                             job("8", 1, "n1", 1), 0);
  REQUIRE(r1.action == A::restart);
  CHECK(r1.message.find("(step 20, no checkpoint yet)") != std::string::npos);
  CHECK(r1.record["checkpoint"] == -1);  // the record keeps the number
  std::ofstream(d / "events.jsonl") << start_record("8", 0, "n[1-2]", 2, -1).dump() << "\n"
                                    << r1.record.dump() << "\n"
                                    << start_record("8", 1, "n1", 1, -1).dump() << "\n";
  Result st = runner_cmd("status " + d.string());
  CAPTURE(st.out);
  CHECK(st.out.find("started over from step 0 (no checkpoint yet) at") != std::string::npos);
  CHECK(st.out.find("step 20 reached, no checkpoint yet; nodes had: n1 n2; lost: n2") != std::string::npos);
  CHECK(st.out.find("step -1") == std::string::npos);
  CHECK(st.out.find("checkpoint -1") == std::string::npos);
}
