// Automatic restart after a failure under Slurm: whether a job whose ranks failed
// is requeued, and the records of every restart, refusal, shrink and growth in events.jsonl.
//
// The decision is the runner's, the requeue the batch script's. The script runs
// `runner restart-check` once srun has returned (scripts/slurm.sbatch.in) and requeues when
// told to; the runner itself checks at start for an attempt that vanished without a record (a
// node failure took the batch host, Slurm requeued the job by itself). Both paths need the run's
// records (JSON), the recipe's train.max_restarts with its --set overrides, and the same
// limit and same-step rule, so the policy lives here once, testable without Slurm, and the
// script stays a few lines of Slurm commands.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/run/slurm.h"

namespace runner {


struct RestartPolicy {
  int64_t max_restarts = 3;  // train.max_restarts: failures restarted per Slurm job (0: none)
  double backoff_s = 30;     // train.restart_backoff: before restart n, backoff x 2^(n-1)
};
RestartPolicy restart_policy(const Recipe& r);
double restart_backoff(const RestartPolicy& p, int64_t attempt);  // attempt >= 1

// What the run directory says about the attempts so far.
struct RunHistory {
  std::vector<nlohmann::json> events;  // events.jsonl, in order
  int64_t step_reached = -1;           // the last step recorded in metrics.jsonl (-1: none)
  int64_t checkpoint = -1;             // the LATEST checkpoint's step (-1: none)
  double last_activity = 0;            // unix time of the run's last record (metrics.jsonl or events.jsonl)
};
RunHistory read_run_history(const std::string& run_dir, const std::string& checkpoint_dir);

// What the batch script knows once srun has returned.
struct AttemptOutcome {
  int srun_code = 0;
  std::vector<int> rank_codes;  // the non-zero codes the ranks recorded themselves (record_rank_exit)
  bool term_signal = false;     // the batch shell got SIGTERM: scancel, the time limit or Slurm's own kill
  std::string job_state;        // scontrol's JobState now ("" unknown)
  std::vector<std::string> nodes_down;  // nodes Slurm has down, drained or not responding
};

struct RestartDecision {
  enum class Action {
    none,            // nothing to do: the run finished, or the start-up already refused and said so
    restart,         // requeue after backoff_s
    refuse,          // no restart; `record` says why
    slurm_requeues,  // Slurm requeues the job itself (a node failure): the next start records it
  };
  Action action = Action::none;
  std::string message;       // for the job's output
  double backoff_s = 0;
  nlohmann::json record;     // the events.jsonl record ("restart" or "no_restart"); null: none
};

// After srun returned (`runner restart-check`), for Slurm job `env`.
RestartDecision decide_after_attempt(const RunHistory& h, const RestartPolicy& p, const AttemptOutcome& o,
                                     const SlurmEnv& env);

// At start: Slurm requeued this job (SLURM_RESTART_COUNT grew) after an attempt that left a
// start record and nothing after it. A restart (its backoff_s is what is left of the backoff
// since the attempt's last record), a refusal (the caller exits kExitNoRestart), or none.
RestartDecision decide_at_start(const RunHistory& h, const RestartPolicy& p, const SlurmEnv& env, double now);

// At start: a `shrink` or `grow` record when this Slurm job runs on fewer or more nodes than the
// run's previous start (null otherwise).
nlohmann::json node_change_record(const RunHistory& h, const SlurmEnv& env);

// "n[1-3,5],login" -> n1 n2 n3 n5 login (Slurm's host list syntax, one bracket per name).
std::vector<std::string> expand_hostlist(const std::string& list);
// Nodes from `sinfo -h -N -o '%N %T'` lines (separated by newlines or ';') that are down,
// drained, failing or not responding (a '*' after the state).
std::vector<std::string> down_nodes(const std::string& sinfo_lines);

// A rank's own exit code, appended as "PROCID CODE" to $RUNNER_EXIT_RECORD when the script set it
// (srun's code is the highest of the ranks', and a peer killed by signal hides an exit 2).
void record_rank_exit(int code);
std::vector<int> read_rank_exits(const std::string& path);

// The fewest nodes (of `max_nodes`, `per_node` ranks each) on which `r` plans and fits the
// memory ledger at the dp they give with the global batch kept: --nodes=MIN-MAX of --elastic.
int64_t min_elastic_nodes(const Recipe& r, int64_t per_node, int64_t max_nodes);

}  // namespace runner
