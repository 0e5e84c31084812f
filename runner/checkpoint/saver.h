// The checkpoint saver: when a run saves (cadence), along which path, and what it keeps
// (retention), on every rank of the job.
//
// Design:
// - The loop calls after_step() at each step boundary and the saver decides itself whether a
//   save is due (as torchtitan's checkpointer does): every N steps, every N minutes, auto (the
//   first boundary saves and measures the write; then every max(20 x that time, a floor)
//   seconds) or never. Rank 0 decides and every rank follows, since the time-based cadences
//   would differ between ranks' clocks.
// - Three paths, chosen by the layout and checkpoint.async: one rank writes its own state
//   (serially, or asynchronously: a copy in host memory at the step boundary, written by one
//   background thread while training goes on); several ranks write their slices of every
//   logical tensor into one file with parallel HDF5 (write_sharded, state_shards.h);
//   asynchronous saves across ranks gather the logical state on rank 0, whose writer thread
//   saves it (collective MPI-IO cannot run behind the training thread's own collectives).
// - At most one write is in flight: the next save joins it first. A failed background write is
//   kept and rethrown on the training thread by the next save, wait or poll, so a run fails
//   loudly instead of training on without checkpoints. Retention runs on the publishing rank
//   after each published save.
#pragma once
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/grid.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}

namespace runner {

class StagedState;  // staging.h

class CheckpointSaver {
 public:
  // A run's saver on every rank of `grid` (calls marked collective are made by all ranks), with
  // the plan's checkpoint section and layout. Writes nothing until the first save.
  CheckpointSaver(const Plan& plan, parallel::Grid& grid, std::string checkpoint_dir, std::shared_ptr<spdlog::logger> log);
  // One process saving the state it is given, whole (no layout, no other ranks; benchmarks, tests).
  CheckpointSaver(std::string checkpoint_dir, CheckpointConfig cfg, std::shared_ptr<spdlog::logger> log = nullptr);
  ~CheckpointSaver();  // joins a write in flight (its error is logged, not thrown)
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  const std::string& dir() const { return dir_; }

  // Collective, at the boundary after step st.step, `elapsed_seconds` into the run: saves `st`
  // when the cadence says a save is due (never at the run's last step, train.steps: the final
  // save writes that one). Returns whether it saved.
  bool after_step(const TrainState& st, double elapsed_seconds);
  // Collective: saves `st` now, along the path the layout and checkpoint.async call for. final
  // (the end of the run, a preemption): synchronous and durable (published) on every rank's
  // return. A step already saved is skipped.
  void save(const TrainState& st, bool final = false);
  // The run continues from `step`'s checkpoint (resume.h loaded it): it is on disk, so neither
  // the cadence nor the final save writes that step again.
  void resumed_at(int64_t step);

  // Every call that surfaces a failed write (save, after_step, wait, poll) throws UserError
  // naming the directory and the cause (disk full, permissions); the last published checkpoint
  // stays intact.
  void wait();               // joins a write in flight
  void poll();               // rank 0: a finished background write's failure, without waiting
  void remove_stale_files(); // rank 0: temporary files of writes that were killed

  // Measurements (this rank's).
  double last_stall_ms() const;          // rank 0: how long the last save blocked training (0 elsewhere)
  double last_stall_seconds() const;     // sync: the whole write; async: the copy into host memory
  double last_write_seconds() const;     // disk cost of the last completed write
  double auto_interval_seconds() const;  // 0 until measured (auto cadence)
  int64_t last_saved_step() const;
  int64_t saves_completed() const;
  double auto_min_interval_seconds = 10.0;  // floor of the auto interval (tiny models write in ms)

 private:
  bool multi() const { return grid_ && grid_->world_size() > 1; }
  bool lead() const { return !grid_ || grid_->rank() == 0; }
  bool due_here(int64_t step, double elapsed);  // the deciding rank's cadence
  void save_unchecked(const TrainState& st, bool final);
  void save_local(const TrainState& s, bool final);  // this process writes `s` (async: in the background)
  void save_collective(const TrainState& local);     // every rank writes its slices (write_sharded)
  void write_now(StagedState& s);                     // waits for its copies, writes, retention, measurements (either thread)
  void record_write(const SaveResult& r, bool publisher);
  void join_and_rethrow();
  spdlog::logger& log() const;

  const Plan* plan_ = nullptr;         // nullptr: one process, its state whole
  parallel::Grid* grid_ = nullptr;
  std::string dir_;
  CheckpointConfig cfg_;
  WriteOptions wopt_;
  std::shared_ptr<spdlog::logger> log_;
  int64_t last_step_ = std::numeric_limits<int64_t>::max();  // train.steps: the final save's

  std::thread worker_;
  mutable std::mutex mu_;           // guards the fields below, shared with the writer thread
  std::exception_ptr error_;
  double last_stall_ = 0, last_write_ = 0, auto_interval_ = 0;
  int64_t last_saved_step_ = -1, saves_ = 0;
  double next_due_elapsed_ = -1;    // minutes/auto: when the next save is due (-1: not yet known)
  double last_due_elapsed_ = 0;     // auto: when the save whose cost is being measured was due
  bool auto_pending_ = false;       // auto: first save requested, its cost not yet known
};

}  // namespace runner
