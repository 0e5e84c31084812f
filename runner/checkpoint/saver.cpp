// The checkpoint saver (see saver.h).
#include "runner/checkpoint/saver.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "parallel/comm.h"
#include "runner/checkpoint/staging.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A checkpoint that cannot be written (disk full, permissions, quota) stops the run as a user
// error, exit 2, on every rank: the writer removed its temporary file and the previous
// checkpoint stays published.
template <class F>
void as_write_error(const std::string& dir, F&& f) {
  try {
    f();
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    // HDF5 often reports a failed write without errno's reason: say when the disk is full.
    std::error_code ec;
    const fs::space_info sp = fs::space(dir, ec);
    uintmax_t one = 0;  // the size of a published checkpoint
    for (int64_t s : list_checkpoint_steps(dir)) one = std::max(one, fs::file_size(fs::path(dir) / checkpoint_file_name(s), ec));
    const std::string full =
        !ec && (sp.available < (1u << 20) || sp.available < one)
            ? fmt::format(" (No space left on device: {} bytes free on that file system, a checkpoint takes {})",
                          sp.available, one)
            : "";
    throw UserError({dir, 0, 0}, std::string("cannot write a checkpoint: ") + e.what() + full,
                    "free space on that file system or fix its permissions, then continue with `runner resume RUN_DIR` "
                    "(the last published checkpoint is intact)");
  }
}

// Keeps `newest`, the keep_last newest at or below it and every keep_every-th; removes the rest
// of those at or below it. Newer ones (left by a resume from an earlier step) are left alone.
void apply_retention(const std::string& dir, const CheckpointConfig& cfg, int64_t newest, spdlog::logger& log) {
  const int64_t keep_last = std::max<int64_t>(1, cfg.keep_last);
  std::vector<int64_t> older;  // steps <= newest, ascending
  bool newer_exist = false;
  for (int64_t s : list_checkpoint_steps(dir)) {
    if (s <= newest) older.push_back(s);
    else newer_exist = true;
  }
  std::set<int64_t> keep{newest};
  for (size_t i = 0; i < older.size() && static_cast<int64_t>(i) < keep_last; ++i) keep.insert(older[older.size() - 1 - i]);
  if (cfg.keep_every > 0)
    for (int64_t s : older)
      if (s % cfg.keep_every == 0) keep.insert(s);
  for (int64_t s : older) {
    if (keep.count(s)) continue;
    std::error_code ec;
    fs::remove(fs::path(dir) / checkpoint_file_name(s), ec);
    if (ec) log.warn("checkpoint retention: cannot remove {}: {}", checkpoint_file_name(s), ec.message());
  }
  if (newer_exist)
    log.warn("checkpoint directory {} holds checkpoints newer than step {} (from before a resume at an earlier step); "
             "retention leaves them alone",
             dir, newest);
}

}  // namespace

CheckpointSaver::CheckpointSaver(const Plan& plan, parallel::Grid& grid, std::string checkpoint_dir,
                                 std::shared_ptr<spdlog::logger> log)
    : CheckpointSaver(std::move(checkpoint_dir), plan.recipe.checkpoint, std::move(log)) {
  plan_ = &plan;
  grid_ = &grid;
  last_step_ = plan.recipe.train.steps;
}

CheckpointSaver::CheckpointSaver(std::string checkpoint_dir, CheckpointConfig cfg, std::shared_ptr<spdlog::logger> log)
    : dir_(std::move(checkpoint_dir)), cfg_(std::move(cfg)), log_(std::move(log)) {
  wopt_.optimizer_bf16 = cfg_.optimizer_dtype == MomentFormat::bf16;
  if (cfg_.cadence == CheckpointCadence::minutes) next_due_elapsed_ = cfg_.every_minutes * 60.0;
}

CheckpointSaver::~CheckpointSaver() {
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      log().error("a background checkpoint write failed and was never reported: {}", e.what());
    }
  }
}

spdlog::logger& CheckpointSaver::log() const { return log_ ? *log_ : *spdlog::default_logger_raw(); }

// ---- when ----

bool CheckpointSaver::due_here(int64_t step, double elapsed) {
  std::lock_guard<std::mutex> lk(mu_);
  if (step <= last_saved_step_ || cfg_.cadence == CheckpointCadence::never) return false;
  if (cfg_.cadence == CheckpointCadence::steps) return cfg_.every_steps > 0 && step % cfg_.every_steps == 0;
  if (cfg_.cadence == CheckpointCadence::minutes) {
    if (elapsed < next_due_elapsed_) return false;
    next_due_elapsed_ = elapsed + cfg_.every_minutes * 60.0;
    return true;
  }
  // auto: the first boundary saves (and measures); then every auto_interval_ seconds.
  if (auto_interval_ <= 0) {
    if (auto_pending_) return false;  // the measuring save is still being written
    auto_pending_ = true;
    last_due_elapsed_ = elapsed;
    return true;
  }
  if (next_due_elapsed_ < 0) next_due_elapsed_ = last_due_elapsed_ + auto_interval_;
  if (elapsed < next_due_elapsed_) return false;
  next_due_elapsed_ = elapsed + auto_interval_;
  return true;
}

bool CheckpointSaver::after_step(const TrainState& st, double elapsed_seconds) {
  if (st.step >= last_step_) return false;
  int64_t due = lead() && due_here(st.step, elapsed_seconds);
  if (grid_) grid_->world().allreduce_max(&due, 1);  // rank 0 decides
  if (!due) return false;
  save(st, /*final=*/false);
  return true;
}

void CheckpointSaver::resumed_at(int64_t step) {
  std::lock_guard<std::mutex> lk(mu_);
  last_saved_step_ = step;
}

// ---- along which path ----

void CheckpointSaver::save(const TrainState& st, bool final) {
  as_write_error(dir_, [&] { save_unchecked(st, final); });
}

void CheckpointSaver::save_unchecked(const TrainState& st, bool final) {
  if (!multi()) {
    // A 16-bit run stores its fp32 weights (the masters, or the values widened): the logical state.
    const bool fp32_state = st.params.values.empty() || st.params.values[0].dtype() == ops::DType::F32;
    if (fp32_state) save_local(st, final);
    else save_local(fp32_weights_view(st), final);
    if (final) join_and_rethrow();
    return;
  }
  if (!cfg_.async || final) {  // each rank writes its slices into the one file
    save_collective(st);
    return;
  }
  TrainState logical = gather_logical_state(*plan_->layout, *grid_, st);
  if (lead()) save_local(logical, /*final=*/false);
  grid_->world().barrier();
}

void CheckpointSaver::save_local(const TrainState& s, bool final) {
  join_and_rethrow();  // at most one write in flight; a previous failure surfaces here
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (s.step == last_saved_step_) return;  // already on disk (e.g. a cadence save at the last step)
    last_saved_step_ = s.step;
  }
  auto t0 = std::chrono::steady_clock::now();
  double stall;
  if (cfg_.async && !final) {
    // The stall: queueing the copies out of the device (a host copy for host tensors); the
    // writer thread waits for them to land before it reads a byte.
    auto staged = std::make_shared<StagedState>(s, /*copy=*/true);
    stall = seconds_since(t0);
    worker_ = std::thread([this, staged] {
      try {
        write_now(*staged);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = std::current_exception();
      }
    });
  } else {
    StagedState staged(s, /*copy=*/false);
    write_now(staged);
    stall = seconds_since(t0);
  }
  std::lock_guard<std::mutex> lk(mu_);
  last_stall_ = stall;
}

void CheckpointSaver::save_collective(const TrainState& local) {
  parallel::Communicator& world = grid_->world();
  // A failed background write (rank 0's, from an asynchronous save) fails every rank; a step
  // already saved is skipped by every rank (other ranks' savers may not know of it).
  std::exception_ptr pending;
  try {
    join_and_rethrow();
  } catch (...) {
    pending = std::current_exception();
  }
  int64_t previous = last_saved_step();
  int64_t flags[2] = {pending ? 1 : 0, previous == local.step ? 1 : 0};
  world.allreduce_max(flags, 2);
  if (flags[0]) {
    if (pending) std::rethrow_exception(pending);
    throw std::runtime_error("checkpoint: an earlier background checkpoint write failed on rank 0 (see its log)");
  }
  if (flags[1]) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last_saved_step_ = local.step;  // claimed before the write, as a local save does
  }
  auto t0 = std::chrono::steady_clock::now();
  SaveResult r;
  try {
    r = write_sharded(*plan_->layout, *grid_, dir_, local, wopt_);
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    last_saved_step_ = previous;  // nothing was published: the same step may be saved again
    throw;
  }
  record_write(r, grid_->rank() == 0);
  const double stall = seconds_since(t0);
  std::lock_guard<std::mutex> lk(mu_);
  last_stall_ = stall;
}

// ---- writing and what follows it ----

void CheckpointSaver::write_now(StagedState& s) { record_write(write_checkpoint_atomic(dir_, s, wopt_), true); }

void CheckpointSaver::record_write(const SaveResult& r, bool publisher) {
  if (publisher) apply_retention(dir_, cfg_, r.step, log());
  const double mb = static_cast<double>(r.file_bytes) / 1e6;
  // Every rank of a collective save records it; the publisher says so at info level.
  log().log(publisher ? spdlog::level::info : spdlog::level::debug, "checkpoint step {} -> {} ({:.1f} MB in {:.3f} s, {:.0f} MB/s)",
            r.step, r.path, mb, r.write_seconds, r.write_seconds > 0 ? mb / r.write_seconds : 0.0);
  std::lock_guard<std::mutex> lk(mu_);
  last_write_ = r.write_seconds;
  ++saves_;
  if (cfg_.cadence == CheckpointCadence::automatic && auto_interval_ <= 0) {
    auto_interval_ = std::max(20.0 * r.write_seconds, auto_min_interval_seconds);
    auto_pending_ = false;
    log().info("checkpoint cadence auto: a save takes {:.3f} s, so saving every {:.1f} s keeps it near 5% of the time{}",
               r.write_seconds, auto_interval_,
               auto_interval_ > 20.0 * r.write_seconds ? fmt::format(" (floor {:.0f} s)", auto_min_interval_seconds) : "");
  }
}

void CheckpointSaver::join_and_rethrow() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void CheckpointSaver::wait() {
  as_write_error(dir_, [&] { join_and_rethrow(); });
}

void CheckpointSaver::poll() {
  if (!lead()) return;
  as_write_error(dir_, [&] {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lk(mu_);
      std::swap(e, error_);
    }
    if (e) {
      if (worker_.joinable()) worker_.join();  // the thread stored its error and is finishing
      std::rethrow_exception(e);
    }
  });
}

void CheckpointSaver::remove_stale_files() {
  if (lead()) cleanup_stale(dir_);
}

// ---- measurements ----

namespace {
// A field the writer thread also writes, read under its mutex.
template <class T>
T read_locked(std::mutex& mu, const T& field) {
  std::lock_guard<std::mutex> lk(mu);
  return field;
}
}  // namespace

double CheckpointSaver::last_stall_ms() const { return lead() ? last_stall_seconds() * 1e3 : 0.0; }
double CheckpointSaver::last_stall_seconds() const { return read_locked(mu_, last_stall_); }
double CheckpointSaver::last_write_seconds() const { return read_locked(mu_, last_write_); }
double CheckpointSaver::auto_interval_seconds() const { return read_locked(mu_, auto_interval_); }
int64_t CheckpointSaver::last_saved_step() const { return read_locked(mu_, last_saved_step_); }
int64_t CheckpointSaver::saves_completed() const { return read_locked(mu_, saves_); }

}  // namespace runner
