// Slurm without a cluster: the script `runner launch --slurm` writes (fields from the recipe
// and plan, a valid bash script, options refused with exit 2), the allocation check and elastic
// re-derivation inside a job (from Slurm's environment), and `runner status` on a real run
// directory. tests/slurm/ runs all of it on a real Slurm cluster (the test_slurm soak).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/run/run_lock.h"
#include "runner/run/slurm.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

using test_support::Result;
using test_support::runner_cmd;
using test_support::sh;

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("slurm", name); }

const std::string kTiny = std::string(RUNNER_TEST_DIR) + "/slurm/tiny.yaml";

// The value of `#SBATCH --key=value` in a script ("" when absent).
std::string sbatch_value(const std::string& script, const std::string& key) {
  std::smatch m;
  if (std::regex_search(script, m, std::regex("\n#SBATCH --" + key + "=([^\n]*)"))) return m[1];
  return "";
}

// Slurm's environment for the duration of a test case.
struct SlurmEnvGuard {
  SlurmEnvGuard(const char* job, const char* ntasks) {
    setenv("SLURM_JOB_ID", job, 1);
    setenv("SLURM_NTASKS", ntasks, 1);
    setenv("SLURM_RESTART_COUNT", "2", 1);
    setenv("SLURM_JOB_NODELIST", "node[01-02]", 1);
  }
  ~SlurmEnvGuard() {
    for (const char* v : {"SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST"}) unsetenv(v);
  }
};

}  // namespace

TEST_CASE("runner launch --slurm --dry-run: the script's resources, signal, requeue and srun line follow the recipe") {
  fs::path d = temp_dir("dry");
  Result r = runner_cmd("launch " + kTiny + " --slurm --dry-run --time 00:20:00 --warn 45 --run-dir " + (d / "run").string() +
                        " --set train.steps=50 --set 'optimizer.lr=2e-3'");
  REQUIRE(r.code == 0);
  const std::string& s = r.out;
  CAPTURE(s);
  CHECK(s.rfind("#!/bin/bash\n", 0) == 0);
  CHECK(s.find("{{") == std::string::npos);  // every field filled
  CHECK(sbatch_value(s, "job-name") == "slurm-tiny");
  CHECK(sbatch_value(s, "nodes") == "1");
  CHECK(sbatch_value(s, "ntasks") == "2");  // dp 2 x tp 1 x pp 1
  CHECK(sbatch_value(s, "ntasks-per-node") == "2");
  CHECK(sbatch_value(s, "cpus-per-task") == "1");  // train.threads
  CHECK(sbatch_value(s, "time") == "00:20:00");
  CHECK(sbatch_value(s, "signal") == "USR1@45");  // to the ranks, not B: (the batch shell)
  CHECK(s.find("\n#SBATCH --requeue\n") != std::string::npos);
  CHECK(s.find("\n#SBATCH --open-mode=append\n") != std::string::npos);
  CHECK(sbatch_value(s, "output") == (d / "run").string() + "/slurm-%j.out");
  CHECK(s.find("--gpus-per-node") == std::string::npos);  // a cpu recipe
  CHECK(s.find("export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}") != std::string::npos);
  CHECK(s.find("export OMP_WAIT_POLICY=PASSIVE") != std::string::npos);
  // One srun line (inside the launch-retry loop): pmix (Debian's Open MPI has no PMI-2), the recipe and run dir absolute, the overrides passed on.
  std::smatch m;
  REQUIRE(std::regex_search(s, m, std::regex("\n *srun --mpi=pmix [^\n]*\\\\\n *([^\n]*)\n")));
  const std::string train = m[1];
  CHECK(train.find("\"$RUNNER\" train \"$RECIPE\" --run-dir \"$RUN_DIR\"") != std::string::npos);
  CHECK(train.find("--set train.steps=50 --set optimizer.lr=2e-3") != std::string::npos);
  CHECK(train.find("--elastic") == std::string::npos);
  CHECK(s.find("RECIPE=" + fs::absolute(kTiny).lexically_normal().string()) != std::string::npos);
  CHECK(s.find("RUNNER=" + fs::canonical(RUNNER_BINARY).string()) != std::string::npos);
  // Valid bash, and nothing written by a dry run.
  fs::path f = d / "dry.sbatch";
  std::ofstream(f) << s;
  CHECK(sh("bash -n " + f.string()).code == 0);
  CHECK(!fs::exists(d / "run"));
}

// The generated script run for real, with srun and scontrol replaced by fakes on PATH: it
// requeues on exit 3 only while Slurm still has the job RUNNING, never after a SIGTERM
// (scancel, the time limit) and never a job cancelled between srun's return and the requeue
// (Slurm requeues finished jobs too: that race once brought a cancelled job back in CI).
TEST_CASE("the sbatch script requeues a preempted job, but not a cancelled or timed-out one") {
  fs::path d = temp_dir("requeue");
  Result r = runner_cmd("launch " + kTiny + " --slurm --dry-run --run-dir " + (d / "run").string());
  REQUIRE(r.code == 0);
  fs::path script = d / "job.sbatch";
  std::ofstream(script) << r.out;
  fs::path bin = d / "bin";
  fs::create_directories(bin);
  // srun: exits FAKE_RC; with FAKE_TERM=1 it first sends SIGTERM to the batch shell (as scancel does).
  std::ofstream(bin / "srun") << "#!/bin/bash\n[ \"$FAKE_TERM\" = 1 ] && kill -TERM $PPID\nexit \"$FAKE_RC\"\n";
  // scontrol: logs its arguments; `show job` reports FAKE_STATE.
  std::ofstream(bin / "scontrol") << "#!/bin/bash\necho \"$*\" >>\"$FAKE_LOG\"\n"
                                     "[ \"$1\" = show ] && printf 'JobId=41 JobName=slurm-tiny\\n   JobState=%s Reason=None\\n' \"$FAKE_STATE\"\n"
                                     "exit 0\n";
  fs::permissions(bin / "srun", fs::perms::owner_all);
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
  struct Case {
    const char* rc;
    const char* state;
    const char* term;
    bool requeued;
  };
  for (const Case& c : {Case{"3", "RUNNING", "0", true}, Case{"3", "CANCELLED", "0", false}, Case{"3", "TIMEOUT", "0", false},
                        Case{"3", "RUNNING", "1", false}, Case{"0", "RUNNING", "0", false}, Case{"2", "RUNNING", "0", false}, Case{"1", "RUNNING", "1", false}}) {
    const std::string rc = c.rc, state = c.state, term = c.term;
    CAPTURE(rc);
    CAPTURE(state);
    CAPTURE(term);
    fs::path log = d / "scontrol.log";
    fs::remove(log);
    Result run = sh(std::string("PATH=") + bin.string() + ":$PATH SLURM_JOB_ID=41 SLURM_NTASKS=2 FAKE_RC=" + c.rc +
                    " FAKE_STATE=" + c.state + " FAKE_TERM=" + c.term + " FAKE_LOG=" + log.string() + " bash " + script.string());
    CAPTURE(run.out);
    CHECK(run.code == std::atoi(c.rc));  // the runner's exit code is the job's
    std::ifstream in(log);
    std::string calls((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK((calls.find("requeue 41") != std::string::npos) == c.requeued);
    if (!c.requeued && std::string(c.rc) == "3" && std::string(c.term) == "0")
      CHECK(run.out.find(std::string("the job is ") + c.state + " (cancelled?): no requeue") != std::string::npos);
  }
}

TEST_CASE("runner launch --slurm: --cpus-per-task from the node's CPUs and the ranks per node, OMP_NUM_THREADS to match") {
  // No train.threads: a node of 16 CPUs shared by its 2 ranks gives 8 cores each (not Slurm's 1).
  Result r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set train.threads=0 --node-cpus 16");
  REQUIRE(r.code == 0);
  CHECK(sbatch_value(r.out, "ntasks-per-node") == "2");
  CHECK(sbatch_value(r.out, "cpus-per-task") == "8");
  CHECK(r.out.find("# Cores per rank (its OpenMP threads, OMP_NUM_THREADS below): 16 CPUs per node (--node-cpus) / 2 "
                   "ranks per node.") != std::string::npos);
  CHECK(r.out.find("export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}") != std::string::npos);
  // 8 ranks at 4 per node on 64-CPU nodes: 16 each; one rank per node takes them all.
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set train.threads=0 --set parallel.dp=8 --set batch.global=32 "
                 "--set hardware.devices_per_node=4 --node-cpus 64");
  REQUIRE(r.code == 0);
  CHECK(sbatch_value(r.out, "cpus-per-task") == "16");
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set train.threads=0 --set parallel.dp=1 --set "
                 "hardware.devices_per_node=1 --node-cpus 48");
  CHECK(sbatch_value(r.out, "cpus-per-task") == "48");
  CHECK(r.out.find("# Layout: 1 rank = dp 1 x tp 1 x pp 1,") != std::string::npos);  // not "1 ranks"
  // Without --node-cpus: this machine's CPUs over the ranks per node, never below 1.
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set train.threads=0");
  REQUIRE(r.code == 0);
  const long here = ::sysconf(_SC_NPROCESSORS_ONLN);
  CHECK(sbatch_value(r.out, "cpus-per-task") == std::to_string(std::max(1L, here / 2)));
  CHECK(r.out.find("this machine's; --node-cpus N for other compute nodes") != std::string::npos);
  // train.threads, when set, is what each rank uses: the request follows it.
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set train.threads=3 --node-cpus 16");
  CHECK(sbatch_value(r.out, "cpus-per-task") == "3");
  CHECK(r.out.find("): train.threads.") != std::string::npos);
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --node-cpus -4");
  CHECK(r.code == 2);
}

TEST_CASE("runner launch --slurm: nodes from hardware.devices_per_node, GPUs, elastic, a written script") {
  fs::path d = temp_dir("write");
  // 8 ranks at 4 per node: 2 nodes.
  Result r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set parallel.dp=8 --set batch.global=32 "
                        "--set hardware.devices_per_node=4 --cpus-per-task 3 --elastic --partition gpu --job-name j8");
  REQUIRE(r.code == 0);
  // --elastic: a node range; the fewest nodes the model fits on at dp 4 is 1 (test_restart.cpp has more).
  CHECK(sbatch_value(r.out, "nodes") == "1-2");
  // The most ranks as --ntasks and no --ntasks-per-node: with it, Slurm gives a node range its
  // minimum even when more nodes are idle (seen on tests/slurm/cluster2.sh); srun starts 4 per node.
  CHECK(sbatch_value(r.out, "ntasks") == "8");
  CHECK(sbatch_value(r.out, "ntasks-per-node") == "");
  CHECK(r.out.find("srun --mpi=pmix --kill-on-bad-exit=1 --ntasks=\"$(( SLURM_JOB_NUM_NODES * 4 ))\" --ntasks-per-node=4 ") != std::string::npos);
  CHECK(sbatch_value(r.out, "cpus-per-task") == "3");
  CHECK(sbatch_value(r.out, "partition") == "gpu");
  CHECK(sbatch_value(r.out, "job-name") == "j8");
  CHECK(r.out.find(" --elastic || rc=$?\n") != std::string::npos);
  // A GPU device asks for one per rank.
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --set hardware.device=h100-80gb");
  REQUIRE(r.code == 0);
  CHECK(sbatch_value(r.out, "gpus-per-node") == "2");
  // Without --dry-run: written into the run directory (created for the job's output), executable.
  r = runner_cmd("launch " + kTiny + " --slurm --run-dir " + (d / "run").string());
  CHECK(r.code == 0);
  CHECK(r.out.find("sbatch " + (d / "run" / "slurm.sbatch").string()) != std::string::npos);
  REQUIRE(fs::exists(d / "run" / "slurm.sbatch"));
  CHECK((fs::status(d / "run" / "slurm.sbatch").permissions() & fs::perms::owner_exec) != fs::perms::none);
  r = runner_cmd("launch " + kTiny + " --slurm -o " + (d / "x.sh").string() + " --run-dir " + (d / "run2").string());
  CHECK(r.code == 0);
  CHECK(fs::exists(d / "x.sh"));
  // A template of one's own.
  std::ofstream(d / "t.in") << "#!/bin/bash\n#SBATCH --ntasks={{WORLD}}\necho {{RUN_DIR}}\n";
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --template " + (d / "t.in").string() + " --run-dir /x/y");
  CHECK(r.code == 0);
  CHECK(r.out == "#!/bin/bash\n#SBATCH --ntasks=2\necho /x/y\n");
}

TEST_CASE("runner launch --slurm: bad options exit 2 with what to do, writing nothing") {
  fs::path d = temp_dir("bad");
  const std::string rd = " --run-dir " + (d / "run").string();
  Result r = runner_cmd("launch " + kTiny + " --slurm --time soon" + rd);
  CHECK(r.code == 2);
  CHECK(r.out.find("--time: 'soon' is not a Slurm time limit") != std::string::npos);
  r = runner_cmd("launch " + kTiny + " --slurm --dry-run --submit" + rd);
  CHECK(r.code == 2);
  std::ofstream(d / "t.in") << "#SBATCH --x={{NOPE}}\n";
  r = runner_cmd("launch " + kTiny + " --slurm --template " + (d / "t.in").string() + rd);
  CHECK(r.code == 2);
  CHECK(r.out.find("unknown field {{NOPE}}") != std::string::npos);
  r = runner_cmd("launch " + kTiny + rd);  // --slurm is required (the one scheduler)
  CHECK(r.code == 2);
  r = runner_cmd("launch " + kTiny + " --slurm --set batch.global=15" + rd);  // a plan error
  CHECK(r.code == 2);
  CHECK(r.out.find("--set: global batch 15 is not divisible") != std::string::npos);
  // sbatch that fails (here: none, or no cluster) is exit 2 with its words.
  r = sh("PATH=/nonexistent " + std::string(RUNNER_BINARY) + " launch " + kTiny + " --slurm --submit" + rd);
  CHECK(r.code == 2);
  CHECK(r.out.find("sbatch failed") != std::string::npos);
  CHECK(!fs::exists(d / "run" / "events.jsonl"));
}

TEST_CASE("inside a Slurm allocation: a world other than the recipe's is refused, or elastic re-derives dp and accum") {
  Recipe r = load_recipe(kTiny);  // dp 2, global 16, micro 4
  {
    // Outside Slurm, without elastic: untouched (mpirun derives dp as before).
    Recipe same = fit_allocation(r, 1, false, nullptr);
    CHECK(same.parallel.dp == 2);
    CHECK(same.batch.accum == 0);
  }
  SlurmEnvGuard env("4242", "1");
  // Too small: exit-2 error naming the job, the sizes and the two ways out.
  try {
    fit_allocation(r, 1, false, nullptr);
    FAIL("a 1-task allocation for a 2-rank recipe was accepted");
  } catch (const UserError& e) {
    const std::string w = e.what();
    CAPTURE(w);
    CHECK(w.find("tiny.yaml:") != std::string::npos);
    CHECK(w.find("too small") != std::string::npos);
    CHECK(w.find("Slurm job 4242 has 1 task") != std::string::npos);
    CHECK(w.find("needs 2 ranks") != std::string::npos);
    CHECK(w.find("--ntasks=2") != std::string::npos);
    CHECK(w.find("--elastic") != std::string::npos);
  }
  // The world given by SLURM_NTASKS when no MPI world is known (a process started by hand).
  CHECK_THROWS_AS(fit_allocation(r, 0, false, nullptr), UserError);
  // The matching size passes untouched.
  CHECK(fit_allocation(r, 2, false, nullptr).parallel.dp == 2);
  // Elastic: dp from the world, the same global batch, accum derived again; the change noted.
  std::vector<std::string> notes;
  Recipe e = fit_allocation(r, 1, true, &notes);
  Plan p = make_plan(e, 1);
  CHECK(p.dp == 1);
  CHECK(p.global == 16);
  CHECK(p.micro == 4);
  CHECK(p.accum == 4);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("dp 2 -> 1, accum 2 -> 4, global batch 16 kept") != std::string::npos);
  // More ranks: dp 4, accum 1.
  Plan p4 = make_plan(fit_allocation(r, 4, true, nullptr), 4);
  CHECK(p4.dp == 4);
  CHECK(p4.accum == 1);
  CHECK(p4.global == 16);
  // train.elastic in the recipe does the same as the flag.
  r.train.elastic = true;
  CHECK(make_plan(fit_allocation(r, 1, false, nullptr), 1).accum == 4);
  // A size the global batch does not divide into: exit 2 saying so.
  try {
    fit_allocation(r, 3, true, nullptr);
    FAIL("dp 3 for global 16 was accepted");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("elastic continuation") != std::string::npos);
  }
  // The start record carries the job.
  nlohmann::json j = start_event(p, 1, 20, notes);
  CHECK(j["slurm"]["job_id"] == "4242");
  CHECK(j["slurm"]["restart_count"] == 2);
  CHECK(j["slurm"]["node_list"] == "node[01-02]");
  CHECK(j["resumed_from"] == 20);
  CHECK(j["accum"] == 4);
}

TEST_CASE("runner train in a too small allocation exits 2 before writing anything") {
  fs::path d = temp_dir("small");
  Result r = sh("SLURM_JOB_ID=77 SLURM_NTASKS=1 " + std::string(RUNNER_BINARY) + " train " + kTiny + " --run-dir " +
                (d / "run").string());
  CHECK(r.code == 2);
  CHECK(r.out.find("Slurm job 77 has 1 task") != std::string::npos);
  CHECK(!fs::exists(d / "run"));
}

TEST_CASE("runner status: step, checkpoint, restarts and their causes, Slurm job, the lock's state, ETA while running") {
  fs::path d = temp_dir("status");
  const fs::path run = d / "run";
  // A real run on one rank (elastic: the recipe's layout is 2 ranks), 30 steps, a checkpoint every 10.
  Result r = runner_cmd("train " + kTiny + " --elastic --quiet --set train.steps=30 --run-dir " + run.string());
  REQUIRE(r.code == 0);
  r = runner_cmd("status " + run.string() + " --json");
  REQUIRE(r.code == 0);
  nlohmann::json s = nlohmann::json::parse(r.out);
  CHECK(s["name"] == "slurm-tiny");
  CHECK(s["last_step"] == 30);
  CHECK(s["total_steps"] == 30);
  CHECK(s["state"] == "finished");
  CHECK(s["checkpoint"]["step"] == 30);
  CHECK(s["checkpoint"]["age_s"].get<double>() < 600);
  CHECK(s["restarts"].empty());
  CHECK(s["layout"]["world"] == 1);
  CHECK(s["layout"]["accum"] == 4);  // elastic on one rank
  CHECK(!s.contains("slurm"));
  CHECK(!s.contains("eta_s"));
  r = runner_cmd("status " + run.string());
  CHECK(r.code == 0);
  CHECK(r.out.find("last step   30 / 30 (100%)") != std::string::npos);
  CHECK(r.out.find("checkpoint  step 30 (") != std::string::npos);
  CHECK(r.out.find("restarts    0") != std::string::npos);
  CHECK(r.out.find("state       finished\n") != std::string::npos);
  // One rank, its dp printed in the batch equation too.
  CHECK(r.out.find("layout      1 rank = dp 1 x tp 1 x pp 1, global batch 16 = micro 4 x dp 1 x accum 4\n") !=
        std::string::npos);
  CHECK(r.out.find("eta         none (finished)") != std::string::npos);

  // The run's history as a preempted, killed and resumed Slurm job would leave it; more steps to go.
  {
    std::ifstream in(run / "recipe.yaml");
    std::stringstream t;
    t << in.rdbuf();
    std::string y = std::regex_replace(t.str(), std::regex("steps: 30"), "steps: 90");
    std::ofstream(run / "recipe.yaml") << y;
    std::ofstream ev(run / "events.jsonl", std::ios::app);
    ev << R"({"event":"end","cause":"preempted","signal":"SIGUSR1","step":30,"exit_code":3})" << "\n";
    ev << R"({"event":"start","time":"T1","world":2,"dp":2,"tp":1,"pp":1,"global":16,"micro":4,"accum":2,"resumed_from":30,"notes":["elastic: dp 1 -> 2"],"slurm":{"job_id":"99","job_name":"slurm-tiny","restart_count":1,"node_list":"localhost","ntasks":2,"nnodes":1}})" << "\n";
    ev << R"({"event":"start","time":"T2","world":2,"dp":2,"tp":1,"pp":1,"global":16,"micro":4,"accum":2,"resumed_from":30,"notes":[],"slurm":{"job_id":"99","job_name":"slurm-tiny","restart_count":2,"node_list":"localhost","ntasks":2,"nnodes":1}})" << "\n";
    ev << "{\"event\":\"end\",\"cau";  // torn by a kill
  }
  // metrics.jsonl without its summary: the run is not done.
  {
    std::ifstream in(run / "metrics.jsonl");
    std::string kept, line;
    while (std::getline(in, line))
      if (line.find("\"summary\"") == std::string::npos) kept += line + "\n";
    in.close();
    std::ofstream(run / "metrics.jsonl") << kept;
  }
  r = runner_cmd("status " + run.string() + " --json");
  REQUIRE(r.code == 0);
  s = nlohmann::json::parse(r.out);
  REQUIRE(s["restarts"].size() == 2);
  CHECK(s["restarts"][0]["cause"].get<std::string>().find("preempted by SIGUSR1 at step 30") == 0);
  CHECK(s["restarts"][0]["notes"][0] == "elastic: dp 1 -> 2");
  CHECK(s["restarts"][1]["cause"].get<std::string>().find("killed without a stop record") == 0);
  CHECK(s["slurm"]["job_id"] == "99");
  CHECK(s["slurm"]["restart_count"] == 2);
  CHECK(s["layout"]["dp"] == 2);
  // Nobody holds the lock and the last job left no end record: crashed, no ETA, how to go on.
  CHECK(s["state"] == "crashed");
  CHECK(!s.contains("eta_s"));
  r = runner_cmd("status " + run.string());
  CHECK(r.out.find("slurm       job 99 (slurm-tiny), restart count 2, nodes localhost, 2 task(s)") != std::string::npos);
  CHECK(r.out.find("restarts    2") != std::string::npos);
  CHECK(r.out.find("layout      2 ranks = dp 2 x tp 1 x pp 1, global batch 16 = micro 4 x dp 2 x accum 2\n") !=
        std::string::npos);
  CHECK(r.out.find("state       crashed: its owner is gone without a stop record") != std::string::npos);
  CHECK(r.out.find("continue from step 30 with `runner resume " + run.string() + "`") != std::string::npos);
  CHECK(r.out.find("eta         none (not running)") != std::string::npos);
  CHECK(r.out.find("running or killed") == std::string::npos);
  {
    // A dead owner on this host left its line in the lock file: crashed, and named.
    char host[256] = {0};
    REQUIRE(::gethostname(host, sizeof host - 1) == 0);
    std::ofstream(run / "runner.lock") << "host " << host << " pid 999999 since 2026-01-01T00:00:00Z\n";
    r = runner_cmd("status " + run.string());
    CHECK(r.out.find(std::string("state       crashed: its owner (host ") + host + " pid 999999") != std::string::npos);
    // An owner on another host, its lock free from here but a step recorded just now: a
    // network file system may hide its lock, so the state is unknown, not crashed.
    std::ofstream(run / "runner.lock") << "host node-elsewhere pid 4242 since 2026-01-01T00:00:00Z\n";
    r = runner_cmd("status " + run.string() + " --json");
    s = nlohmann::json::parse(r.out);
    CHECK(s["state"] == "unknown");
    CHECK(s["state_detail"].get<std::string>().find("Run `runner status` on node-elsewhere") != std::string::npos);
    CHECK(!s.contains("eta_s"));
    std::ofstream(run / "runner.lock", std::ios::trunc);
  }
  {
    // A live owner holds the lock: running, named, with an ETA from the last steps.
    RunLock owner(run.string());
    r = runner_cmd("status " + run.string() + " --json");
    REQUIRE(r.code == 0);
    s = nlohmann::json::parse(r.out);
    CHECK(s["state"] == "running");
    CHECK(s["owner"].get<std::string>().find("pid " + std::to_string(::getpid())) != std::string::npos);
    REQUIRE(s.contains("eta_s"));
    CHECK(s["eta_s"].get<double>() == doctest::Approx(60 * s["step_s"].get<double>()));
    CHECK(s["step_s"].get<double>() > 0);
    r = runner_cmd("status " + run.string());
    CHECK(r.out.find("state       running: host ") != std::string::npos);
    CHECK(r.out.find("eta         ") != std::string::npos);
    CHECK(r.out.find("steps left at") != std::string::npos);
  }
  // The owner stopped on Ctrl-C at a checkpoint: stopped, by which signal, and how to go on.
  std::ofstream(run / "events.jsonl", std::ios::app)
      << "\n" << R"({"event":"end","cause":"preempted","signal":"SIGINT","step":30,"exit_code":3})" << "\n";
  r = runner_cmd("status " + run.string());
  CHECK(r.out.find("state       stopped by SIGINT at step 30 (checkpoint written); continue from step 30 with "
                   "`runner resume") != std::string::npos);
  CHECK(r.out.find("eta         none (not running)") != std::string::npos);
  // Not a run directory: exit 2.
  r = runner_cmd("status " + (d / "nothing").string());
  CHECK(r.code == 2);
  CHECK(r.out.find("not a run directory") != std::string::npos);
}
