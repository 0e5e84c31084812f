// The watchdog: no silent hangs. A thread per rank that
//   - writes this rank's heartbeat, RUN_DIR/.ranks/rank-N.json (rank, host, pid, step, phase,
//     the communication it waits on), atomically, every heartbeat_interval();
//   - stops the job at once when a rank this one waits for is gone: its process on this host no
//     longer exists, or an MPI call returned an error (MPI_ERRORS_RETURN: a dead peer);
//   - ends this rank when its launcher is gone (mpirun returned, the job step ended), and, when
//     it stops the job, kills the stopped ranks on this host, which no launcher's SIGTERM reaches:
//     no rank outlives its job;
//   - stops the job when a collective, send or receive has waited longer than the timeout
//     (train.collective_timeout), naming from the other ranks' heartbeats who did not arrive: a
//     rank whose heartbeat went stale (stopped, dead, on an unreachable node), or one that is
//     elsewhere (its phase and step); and when this rank itself made no progress for longer than
//     the timeout with no communication in flight (a stuck data loader or kernel);
//   - stopping is: one message on stderr and the run log, a `hang` and an `end` record in
//     events.jsonl (once per hang: the first rank to see it writes them; the restart decision
//     counts failures, and ranks that all see one hang must not look like several), and exit
//     kExitHang (5) at once (a rank blocked in MPI cannot unwind; the
//     launcher kills the others; the last published checkpoint is what a restart resumes).
// Not hangs: start-up and this job's first step, checkpoint writes (this rank's, or seen in the
// heartbeat of a rank being waited for). An exempt phase pushes the deadline out: the timeout
// counts from the last moment anyone involved was seen exempt. Evaluation batches count as
// progress. docs/slurm.md ("The watchdog") is the user's description.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "parallel/watch.h"

namespace runner {

// What the trainer is doing (set by the trainer's thread; the heartbeat says it).
enum class Phase : int { Startup, Data, Passes, Optimizer, Boundary, Checkpoint, Eval, Done };
const char* phase_name(Phase p);  // "startup", "data", "forward/backward", "optimizer", ...
// Process-wide, cheap (relaxed atomics): the phase and the step it belongs to, and a tick of
// progress inside a long phase (an evaluation batch).
void set_phase(Phase p, int64_t step);
void progress_tick();

// The timeout and where it came from.
struct TimeoutChoice {
  double seconds = 0;
  std::string source;  // "train.collective_timeout", "10 x predicted step 0.2 s (floor 60 s)", ...
  bool from_model = false;
};
constexpr double kTimeoutFloorS = 60.0;      // no derived timeout below a minute (docs/slurm.md)
constexpr double kTimeoutStepMultiple = 10.0;
// explicit_s > 0 wins; else max(floor, 10 x measured step) when measured_step_s > 0, else
// max(floor, 10 x predicted step) (the floor alone without a prediction).
TimeoutChoice choose_timeout(double explicit_s, double predicted_step_s, double measured_step_s);
// How often a heartbeat is written, and how old one must be to count as stopped.
double heartbeat_interval(double timeout_s);
double heartbeat_stale_after(double timeout_s);

// One rank's heartbeat as read back.
struct Heartbeat {
  int rank = -1, pid = 0;
  std::string host, phase;
  std::string attempt;  // the job's attempt id ("" from a writer without one)
  int64_t step = 0;
  bool exempt = false;  // startup, first step, checkpoint
  double time = 0;      // wall clock (Unix seconds) when written
  nlohmann::json wait;  // null, or {op, group, members, peer, seq, bytes, for_s}
};
std::string heartbeat_path(const std::string& run_dir, int rank);
std::optional<Heartbeat> read_heartbeat(const std::string& run_dir, int rank);
// Who of `members` (world ranks, self excluded) did not arrive at `w` that `self` waits on:
// one record each {rank, host, pid, state: "stopped" | "elsewhere" | "no heartbeat", phase,
// step, heartbeat_age_s, doing}; a member waiting on the same call arrived and is left out.
nlohmann::json not_arrived(const parallel::WaitInfo& w, int self, const std::vector<int>& members,
                           const std::vector<std::optional<Heartbeat>>& beats, double now, double stale_s);

class Watchdog {
 public:
  // Starts the thread (and the comm layer's marking). `lead` writes the timeout record;
  // `log_on_console`: `log` already prints to the console, so a hang is not printed twice.
  // `attempt`: this job's id, as its start record has it ("" none): one hang of an attempt gets
  // one `hang` and one `end` record, from the first rank that sees it, and a rank left over
  // from an earlier attempt writes none.
  Watchdog(std::string run_dir, int rank, int world, TimeoutChoice timeout, std::shared_ptr<spdlog::logger> log, bool lead,
           bool log_on_console = false, std::string attempt = "");
  ~Watchdog();  // stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // A step of this job finished in `step_ms`: progress; after the first, the step counts; a
  // timeout from the model is replaced by one from the measured steps after kMeasureSteps.
  void step_done(double step_ms);
  double timeout_s() const { return timeout_ms_.load() / 1e3; }
  const TimeoutChoice& choice() const { return choice_; }
  // Stops and joins the thread, writes the last heartbeat (phase done); marking off.
  void stop();
  static constexpr int kMeasureSteps = 3;  // steps timed after the first
  // An MPI call returned an error (a peer died): names who is gone from the heartbeats, then
  // stops as for a hang. Called on the thread that made the call; does not return.
  [[noreturn]] void comm_failed(const std::string& what);

 private:
  void loop();
  void beat(int64_t now_ns);
  void check(int64_t now_ns);
  void check_wait(const parallel::WaitInfo& w, int64_t now_ns);
  void check_stall(int64_t now_ns);
  void check_stop_signal(int64_t now_ns);
  bool exempt_now() const;
  std::vector<int> members_of(const parallel::WaitInfo& w) const;
  std::vector<std::optional<Heartbeat>> read_beats(const std::vector<int>& ranks) const;
  // Members of `ranks` (self excluded) whose process on this host no longer exists: one
  // not_arrived record each, state "gone".
  nlohmann::json gone_members(const std::vector<int>& ranks, const std::vector<std::optional<Heartbeat>>& beats) const;
  // "" when this rank records the hang; else why it does not.
  std::string hang_recorder() const;
  [[noreturn]] void hang(const std::string& what, nlohmann::json rec, const nlohmann::json& missing);

  std::string run_dir_, host_, attempt_;
  int rank_, world_;
  pid_t parent_;  // the launcher (mpirun, slurmstepd) that started this rank
  TimeoutChoice choice_;
  std::shared_ptr<spdlog::logger> log_;
  bool lead_, log_on_console_;
  std::atomic<int64_t> timeout_ms_;
  std::atomic<int64_t> steps_done_{0};
  std::vector<double> step_ms_;  // the trainer's thread only
  // The watchdog thread's own view.
  int64_t last_progress_ns_ = 0, last_exempt_ns_ = 0, seen_ticks_ = -1;
  int64_t phase_since_ns_ = 0;  // when this rank entered its present phase
  int seen_phase_ = -1;
  int64_t stop_seen_ns_ = 0;  // when this thread first saw a stop signal (0: none yet)
  std::optional<std::vector<int>> host_peers_;  // the ranks on this host, from their heartbeats (read once)
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace runner
