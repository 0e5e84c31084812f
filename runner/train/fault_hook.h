// Fault injection for tests: one hook compiled into every build, read once from the environment
// when the trainer starts, called at named points of the step. Unless a RUNNER_FAULT_* or
// RUNNER_DEBUG_STALL_* variable is set it is inactive and every point returns at once; the loop
// never reads the environment. The variables (their names and meaning are the tests' contract:
// tests/test_resume, test_parallel, test_monitor, test_train_precision, tests/slurm/):
//   RUNNER_FAULT_FAIL_RANK=R, RUNNER_FAULT_FAIL_STEP=N: world rank R fails in the middle of step N,
//     as a crashed kernel or a lost node would.
//   RUNNER_FAULT_NAN_STEP=N: the first time step N runs, its loss and gradients become NaN, as a
//     numerical blow-up would make them.
//   RUNNER_FAULT_INF_STEP=N (and RUNNER_FAULT_INF_COUNT=K, default 1): steps N .. N+K-1 get one
//     gradient element of the last parameter set to +inf (the loss stays finite), as an fp16
//     overflow in the backward would.
//   RUNNER_FAULT_NOISE_STEP=N: step N's batch is random tokens with random targets, as a corrupt
//     shard would be (a loss and gradient-norm spike, for the monitoring's tests).
//   RUNNER_FAULT_STEP_SLEEP_MS=N: each step takes N ms longer (a slow machine; numbers unchanged),
//     so a test's signals, which take a while to arrive, land where they were aimed (tests/slurm/).
//     RUNNER_FAULT_STEP_SLEEP_RANK=R: on world rank R only (default every rank), so the others
//     wait for it at the step boundary (the watchdog's tests stop it there).
//   RUNNER_FAULT_STEP_SLEEP_FILE=PATH: each step takes as many ms longer as PATH holds, read after
//     every step (missing or unreadable: RUNNER_FAULT_STEP_SLEEP_MS's), so that a harness can change
//     the pace while a run goes on: tests/slurm/nodes.sh slows a run down while one of its nodes is
//     away, so that the run cannot end before the node returns and it grows back.
//   RUNNER_DEBUG_STALL_RANK=R, RUNNER_DEBUG_STALL_EVERY=N, RUNNER_DEBUG_STALL_MS=T: world rank R
//     sleeps T ms at the start of every N-th step, as a rank sharing its cores with another job
//     would stall (a straggler, for the monitoring's tests). With T longer than
//     train.collective_timeout it is a stuck data loader, which the watchdog reports.
//   RUNNER_FAULT_CKPT_SLEEP_MS=T (and RUNNER_FAULT_CKPT_SLEEP_RANK=R, default every rank): each
//     checkpoint save takes T ms longer on rank R, as a slow shared file system would make it
//     (the watchdog's tests: a slow checkpoint is not a hang).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runner/data/data.h"
#include "runner/state.h"

namespace runner {

class FaultHook {
 public:
  // Reads the variables; `world_rank` is this process's rank.
  explicit FaultHook(int world_rank);
  bool active() const { return active_; }

  // The points of step `step` (1-based), in the order the step reaches them.
  // Its batches are ready (after any skipped by a rollback): the noise fault.
  void batches_ready(int64_t step, std::vector<Batch>& mbs, int64_t vocab_size) const {
    if (active_) corrupt_batches(step, mbs, vocab_size);
  }
  // The data wait is over: the straggler's stall.
  void after_data(int64_t step) const {
    if (active_) stall(step);
  }
  // Before the forward and backward passes: the failing rank.
  void before_passes(int64_t step) const {
    if (active_) fail(step);
  }
  // The gradients are synchronised: NaN loss and gradients, or an +inf gradient.
  void after_grads(int64_t step, double& loss_sum, ParamSet& params) {
    if (active_) poison(step, loss_sum, params);
  }
  // A checkpoint save was made (inside the checkpoint's phase): the slow file system.
  void after_checkpoint() const {
    if (active_) sleep_after_checkpoint();
  }
  // The step is over (its result is not yet looked at): the slow machine.
  void after_step() const {
    if (active_) sleep_after_step();
  }

 private:
  void corrupt_batches(int64_t step, std::vector<Batch>& mbs, int64_t vocab_size) const;
  void stall(int64_t step) const;
  void fail(int64_t step) const;
  void poison(int64_t step, double& loss_sum, ParamSet& params);
  void sleep_after_step() const;
  void sleep_after_checkpoint() const;

  int rank_;
  int64_t fail_rank_, fail_step_, nan_step_, inf_step_, inf_count_, noise_step_, step_sleep_ms_;
  int64_t stall_rank_, stall_every_, stall_ms_;
  int64_t ckpt_sleep_ms_, ckpt_sleep_rank_, step_sleep_rank_;
  std::string step_sleep_file_;
  bool active_ = false;
};

}  // namespace runner
