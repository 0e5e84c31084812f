// CheckpointManager (cadence, async writes, retention, loading with fallback) and the
// in-memory snapshot tier. The file format itself lives in checkpoint_file.cpp.
//
// Async saving copies the state into host buffers at the step boundary (a parallel memcpy:
// the stall) and hands the copy to one background thread, which runs the same atomic write
// as a sync save. At most one write is in flight: the next save() joins it first. A failed
// background write is kept and rethrown on the training thread by the next save(), wait()
// or poll(), so the run fails loudly instead of training on without checkpoints.
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"

namespace runner {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// memcpy in 4 MiB pieces over the OpenMP pool: a snapshot is memory-bandwidth bound and one
// core cannot saturate it; the pool is idle at a step boundary. Up to 8 threads (bandwidth
// saturates there), and none on small machines, where measured on 2 shared cores the fork-join
// made the copy 3x slower than one memcpy.
void parallel_copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = 4u << 20;
  const int threads = std::min(8, omp_get_max_threads());
  if (n < 2 * kPiece || threads < 4) {
    std::memcpy(dst, src, n);
    return;
  }
  const int64_t pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < pieces; ++i) {
    size_t off = static_cast<size_t>(i) * kPiece;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(kPiece, n - off));
  }
}

ops::Tensor deep_copy(const ops::Tensor& t, ops::Account a) {
  if (!t.defined()) return {};
  ops::Tensor c = ops::Tensor::empty(t.shape(), t.dtype(), a);
  parallel_copy(c.raw(), t.raw(), t.nbytes());
  return c;
}

void copy_into(ops::Tensor& dst, const ops::Tensor& src, const std::string& what) {
  RUNNER_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype(),
               what + ": shape " + src.shape_str() + " does not match " + dst.shape_str());
  parallel_copy(dst.raw(), src.raw(), src.nbytes());
}

void copy_scalars(TrainState& dst, const TrainState& src) { dst.copy_scalars_from(src); }

bool same_layout(const std::vector<ops::Tensor>& a, const std::vector<ops::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].shape() != b[i].shape() || a[i].dtype() != b[i].dtype()) return false;
  return true;
}

}  // namespace

TrainState clone_state(const TrainState& s, ops::Account account) {
  TrainState c;
  copy_scalars(c, s);
  c.recipe_yaml = s.recipe_yaml;
  c.world_rank = s.world_rank;
  c.world_size = s.world_size;
  c.params.names = s.params.names;
  c.params.decay = s.params.decay;
  for (auto& t : s.params.values) c.params.values.push_back(deep_copy(t, account));
  for (auto& t : s.adam_m) c.adam_m.push_back(deep_copy(t, account));
  for (auto& t : s.adam_v) c.adam_v.push_back(deep_copy(t, account));
  for (auto& t : s.masters) c.masters.push_back(deep_copy(t, account));
  return c;
}

// ---------------------------------------------------------------------------------------
// MemorySnapshot

void MemorySnapshot::take(const TrainState& s) {
  bool reuse = valid_ && same_layout(state_.params.values, s.params.values) && same_layout(state_.adam_m, s.adam_m) &&
               same_layout(state_.adam_v, s.adam_v) && same_layout(state_.masters, s.masters);
  if (!reuse) {
    state_ = clone_state(s, ops::Account::Workspace);
  } else {
    for (size_t i = 0; i < s.params.values.size(); ++i) copy_into(state_.params.values[i], s.params.values[i], "snapshot");
    for (size_t i = 0; i < s.adam_m.size(); ++i) copy_into(state_.adam_m[i], s.adam_m[i], "snapshot");
    for (size_t i = 0; i < s.adam_v.size(); ++i) copy_into(state_.adam_v[i], s.adam_v[i], "snapshot");
    for (size_t i = 0; i < s.masters.size(); ++i) copy_into(state_.masters[i], s.masters[i], "snapshot");
    copy_scalars(state_, s);
  }
  valid_ = true;
}

void MemorySnapshot::restore(TrainState& s) const {
  RUNNER_CHECK(valid_, "restore from an empty memory snapshot");
  RUNNER_CHECK(s.params.values.size() == state_.params.values.size(), "snapshot and state hold different parameter sets");
  for (size_t i = 0; i < state_.params.values.size(); ++i)
    copy_into(s.params.values[i], state_.params.values[i], "restore " + state_.params.names[i]);
  if (s.adam_m.empty() && !state_.adam_m.empty()) {
    for (auto& t : state_.adam_m) s.adam_m.push_back(deep_copy(t, ops::Account::Optimizer));
    for (auto& t : state_.adam_v) s.adam_v.push_back(deep_copy(t, ops::Account::Optimizer));
  } else {
    RUNNER_CHECK(s.adam_m.size() == state_.adam_m.size() && s.adam_v.size() == state_.adam_v.size(),
                 "snapshot and state hold different optimizer moments");
    for (size_t i = 0; i < state_.adam_m.size(); ++i) copy_into(s.adam_m[i], state_.adam_m[i], "restore adam_m");
    for (size_t i = 0; i < state_.adam_v.size(); ++i) copy_into(s.adam_v[i], state_.adam_v[i], "restore adam_v");
  }
  RUNNER_CHECK(s.masters.size() == state_.masters.size(), "snapshot and state hold different master weights");
  for (size_t i = 0; i < state_.masters.size(); ++i) copy_into(s.masters[i], state_.masters[i], "restore masters");
  copy_scalars(s, state_);
}

size_t MemorySnapshot::bytes() const {
  size_t n = 0;
  for (auto& t : state_.params.values) n += t.nbytes();
  for (auto& t : state_.adam_m) n += t.nbytes();
  for (auto& t : state_.adam_v) n += t.nbytes();
  for (auto& t : state_.masters) n += t.nbytes();
  return n;
}

void MemorySnapshot::clear() {
  state_ = TrainState{};
  valid_ = false;
}

// ---------------------------------------------------------------------------------------
// CheckpointManager

CheckpointManager::CheckpointManager(std::string dir, CheckpointConfig cfg, CheckpointRank rank)
    : dir_(std::move(dir)), cfg_(std::move(cfg)), rank_(rank) {
  wopt_.optimizer_bf16 = cfg_.optimizer_dtype == MomentFormat::bf16;
  wopt_.rank = rank_;
  if (cfg_.cadence == CheckpointCadence::minutes) next_due_elapsed_ = cfg_.every_minutes * 60.0;
}

CheckpointManager::~CheckpointManager() {
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

void CheckpointManager::set_logger(std::shared_ptr<spdlog::logger> log) { log_ = std::move(log); }

spdlog::logger& CheckpointManager::log() const { return log_ ? *log_ : *spdlog::default_logger_raw(); }

bool CheckpointManager::due(int64_t step, double elapsed) {
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

void CheckpointManager::join_and_rethrow() {
  if (worker_.joinable()) worker_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void CheckpointManager::wait() { join_and_rethrow(); }

void CheckpointManager::poll() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::swap(e, error_);
  }
  if (e) {
    if (worker_.joinable()) worker_.join();  // the thread stored its error and is finishing
    std::rethrow_exception(e);
  }
}

void CheckpointManager::save(const TrainState& s, bool final) {
  join_and_rethrow();  // at most one write in flight; a previous failure surfaces here
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (s.step == last_saved_step_) return;  // already on disk (e.g. a cadence save at the last step)
    last_saved_step_ = s.step;
  }
  auto t0 = std::chrono::steady_clock::now();
  double stall;
  if (cfg_.async && !final) {
    auto snap = std::make_shared<TrainState>(clone_state(s, ops::Account::Workspace));
    stall = seconds_since(t0);
    worker_ = std::thread([this, snap] {
      try {
        write_now(*snap);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        error_ = std::current_exception();
      }
    });
  } else {
    write_now(s);
    stall = seconds_since(t0);
  }
  std::lock_guard<std::mutex> lk(mu_);
  last_stall_ = stall;
}

void CheckpointManager::save_external(int64_t step, const std::function<SaveResult()>& write, bool publisher) {
  join_and_rethrow();
  int64_t previous;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (step == last_saved_step_) return;
    previous = last_saved_step_;
    last_saved_step_ = step;
  }
  auto t0 = std::chrono::steady_clock::now();
  SaveResult r;
  try {
    r = write();
  } catch (...) {
    std::lock_guard<std::mutex> lk(mu_);
    last_saved_step_ = previous;  // nothing was published: the same step may be saved again
    throw;
  }
  record_write(r, publisher);
  const double stall = seconds_since(t0);
  std::lock_guard<std::mutex> lk(mu_);
  last_stall_ = stall;
}

void CheckpointManager::write_now(const TrainState& s) {
  SaveResult r = write_checkpoint_atomic(dir_, s, wopt_);
  record_write(r, rank_.rank == 0);
}

void CheckpointManager::record_write(const SaveResult& r, bool publisher) {
  if (publisher) apply_retention(r.step);
  const double mb = static_cast<double>(r.file_bytes) / 1e6;
  // Every rank of a collective save records it; the publisher says so at info level.
  log().log(publisher ? spdlog::level::info : spdlog::level::debug, "checkpoint step {} -> {} ({:.1f} MB in {:.3f} s, {:.0f} MB/s)", r.step, r.path, mb, r.write_seconds,
             r.write_seconds > 0 ? mb / r.write_seconds : 0.0);
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

void CheckpointManager::apply_retention(int64_t newest) {
  const int64_t keep_last = std::max<int64_t>(1, cfg_.keep_last);
  std::vector<int64_t> older;  // steps <= newest, ascending
  bool newer_exist = false;
  for (int64_t s : list_checkpoint_steps(dir_)) {
    if (s <= newest) older.push_back(s);
    else newer_exist = true;
  }
  std::set<int64_t> keep{newest};
  for (size_t i = 0; i < older.size() && static_cast<int64_t>(i) < keep_last; ++i) keep.insert(older[older.size() - 1 - i]);
  if (cfg_.keep_every > 0)
    for (int64_t s : older)
      if (s % cfg_.keep_every == 0) keep.insert(s);
  for (int64_t s : older) {
    if (keep.count(s)) continue;
    std::error_code ec;
    fs::remove(fs::path(dir_) / checkpoint_file_name(s), ec);
    if (ec) log().warn("checkpoint retention: cannot remove {}: {}", checkpoint_file_name(s), ec.message());
  }
  if (newer_exist)
    log().warn("checkpoint directory {} holds checkpoints newer than step {} (from before a resume at an earlier step); "
               "retention leaves them alone",
               dir_, newest);
}

bool CheckpointManager::has_checkpoints() const { return !list_checkpoint_steps(dir_).empty() || !read_latest(dir_).empty(); }

std::vector<std::string> CheckpointManager::candidates(int64_t step) const {
  const std::vector<int64_t> steps = list_checkpoint_steps(dir_);
  std::vector<std::string> out;
  int64_t first = -1;
  if (step >= 0) {
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
      std::string have;
      for (auto x : steps) have += (have.empty() ? "" : ", ") + std::to_string(x);
      throw UserError(SourceLoc{dir_, 0, 0},
                      fmt::format("no checkpoint for step {} (this directory holds steps: {})", step, have.empty() ? "none" : have),
                      "pick one of those with --step, or omit --step to resume from LATEST");
    }
    first = step;
  } else {
    const std::string latest = read_latest(dir_);
    if (latest.empty()) {
      if (steps.empty()) {
        if (fs::exists(fs::path(dir_) / "LATEST"))
          throw UserError(SourceLoc{(fs::path(dir_) / "LATEST").string(), 0, 0},
                          "LATEST does not name a checkpoint file and the directory holds none", "remove LATEST to start over");
        return out;
      }
      log().warn("{} has no valid LATEST (a crash before the first LATEST was written, or it was removed); trying the newest "
                 "step file",
                 dir_);
      first = steps.back();
    } else {
      parse_checkpoint_file_name(latest, &first);
    }
  }
  out.push_back(checkpoint_file_name(first));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (*it < first) out.push_back(checkpoint_file_name(*it));
  return out;
}

int64_t CheckpointManager::load_from(const std::vector<std::string>& cands, TrainState& s, bool strict) {
  std::vector<std::string> failures;
  for (size_t i = 0; i < cands.size(); ++i) {
    const std::string path = (fs::path(dir_) / cands[i]).string();
    try {
      load_checkpoint_file(path, s, subset_);
    } catch (const UserError& e) {
      if (strict) throw;
      log().warn("checkpoint {} does not verify: {}", path, e.what());
      failures.push_back(e.what());
      if (i + 1 < cands.size()) log().warn("falling back to the next older checkpoint, {}", cands[i + 1]);
      continue;
    }
    if (!failures.empty())
      log().warn("resumed from {} (step {}) instead of {}: newer checkpoints did not verify (see above; --strict makes "
                 "this an error)",
                 path, s.step, cands[0]);
    else
      log().info("resumed from {} (step {})", path, s.step);
    std::lock_guard<std::mutex> lk(mu_);
    last_saved_step_ = s.step;
    return s.step;
  }
  std::string all;
  for (auto& f : failures) all += "\n  " + f;
  throw UserError(SourceLoc{dir_, 0, 0}, "no checkpoint in this directory verifies:" + all,
                  "check them with `runner inspect FILE`; to start over, use a new run directory");
}

std::optional<int64_t> CheckpointManager::load_latest(TrainState& s, bool strict) {
  wait();
  auto cands = candidates(-1);
  if (cands.empty()) return std::nullopt;
  return load_from(cands, s, strict);
}

int64_t CheckpointManager::load_step(int64_t step, TrainState& s, bool strict) {
  wait();
  RUNNER_CHECK(step >= 0, "load_step of a negative step");
  return load_from(candidates(step), s, strict);
}

double CheckpointManager::last_stall_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_stall_;
}
double CheckpointManager::last_write_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_write_;
}
double CheckpointManager::auto_interval_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return auto_interval_;
}
int64_t CheckpointManager::last_saved_step() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_saved_step_;
}
int64_t CheckpointManager::saves_completed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return saves_;
}

}  // namespace runner
