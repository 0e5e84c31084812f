// Fault injection for tests: one hook compiled into every build, configured from the knobs
// (ops/knobs.h, read once from the environment), called at named points of the step. Unless a
// RUNNER_FAULT_* or RUNNER_DEBUG_STALL_* variable is set it is inactive and every point returns
// at once. It is the only thing that turns the fault knobs into faults: the step's below, and,
// through arm_fault_points, the checkpoint's and the data loader's. The variables (their names
// and meaning are the tests' contract: tests/test_resume, test_parallel, test_monitor,
// test_train_precision, test_checkpoint, test_hardening, tests/slurm/; docs/knobs.md):
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
// The fault points of the rooms below the trainer, armed by arm_fault_points in every command
// (runner/main.cpp) and when a trainer starts:
//   RUNNER_DEBUG_DATA_DELAY_MS=T: each micro-batch takes T ms longer to build, as a slow file
//     system or tokenizer would (a slow data source, for the monitoring's tests).
//   RUNNER_CKPT_FAULT_AFTER_BYTES=N: a checkpoint write stops after N bytes of tensor data, with
//     a CheckpointFault, or with RUNNER_CKPT_FAULT_EXIT=1 by _exit(137), as a crash would.
//   RUNNER_CKPT_FAULT_SLOW_MS=N: each save takes N ms longer before its rename (a slow file
//     system), so a test can signal while a checkpoint is being written (tests/slurm/run.sh).
//   RUNNER_CKPT_FAULT_VERIFY_ABORT=SUBSTRING: verifying a checkpoint whose path contains it
//     aborts, as libhdf5 crashes on some damaged files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/knobs.h"
#include "runner/data/data.h"
#include "runner/state.h"

namespace runner {

// Arms the checkpoint's and the data loader's fault points (checkpoint.h, data.h) from the
// knobs set; a point whose knob is unset is left as it is (a test may have set it itself).
void arm_fault_points(const ops::Knobs::Faults& f = ops::knobs().faults);

class FaultHook {
 public:
  // `world_rank` is this process's rank; the faults are the knobs' (ops::knobs()). Also arms
  // the fault points below the trainer (arm_fault_points).
  explicit FaultHook(int world_rank) : FaultHook(world_rank, ops::knobs().faults) {}
  FaultHook(int world_rank, const ops::Knobs::Faults& f);
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
