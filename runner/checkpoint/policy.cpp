// The checkpoint policy of a run (see policy.h).
#include "runner/checkpoint/policy.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "parallel/comm.h"
#include "runner/agree.h"
#include "runner/run/run_lock.h"
#include "runner/checkpoint/state_shards.h"

namespace fs = std::filesystem;

extern char** environ;

namespace runner {

namespace {

// Whether the user's --set overrides gave `field` or anything under it ("parallel" covers
// "parallel.tp"): the recipe records where each field was written.
bool overridden(const Recipe& r, const std::string& field) {
  for (const auto& [path, loc] : r.locs)
    if (loc.file == "--set" && (path == field || path.rfind(field + ".", 0) == 0 || path.rfind(field + "[", 0) == 0))
      return true;
  return false;
}

// The verdict a verifying child process sent: "O" (verified) or "E" problem NUL fix; anything
// else (a signal, no record) means the file crashed the reader.
void child_verdict(const std::string& path, const std::string& rec, int st) {
  const bool clean = WIFEXITED(st) && WEXITSTATUS(st) == 0 && !rec.empty();
  if (clean && rec == "O") return;
  if (clean && rec[0] == 'E') {
    const size_t nul = rec.find('\0');
    throw UserError({path, 0, 0}, rec.substr(1, nul == std::string::npos ? std::string::npos : nul - 1),
                    nul == std::string::npos ? std::string() : rec.substr(nul + 1));
  }
  throw UserError({path, 0, 0},
                  fmt::format("checkpoint is corrupt: reading its HDF5 metadata crashed the reader ({})",
                              WIFSIGNALED(st) ? fmt::format("signal {}", WTERMSIG(st)) : std::string("no verdict")),
                  "use an older checkpoint (runner resume --step N) or start over");
}

std::string read_all(int fd) {
  std::string rec;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    rec.append(buf, static_cast<size_t>(n));
  }
  return rec;
}

std::string g_verifier_exe;  // set by the runner's main (set_checkpoint_verifier)

// Under MPI: a fork of an MPI process is unsafe (Open MPI's registered memory, its progress
// threads), so the verifier is a fresh process instead: the runner binary's hidden
// `__verify-checkpoint FILE`, started with posix_spawn (glibc: clone(CLONE_VM | CLONE_VFORK) +
// exec, no copy of the address space) and an environment without the launcher's variables, so
// it does not take itself for an MPI rank. It writes the same record as the forked child.
// false: it could not be started (the caller verifies in-process).
bool verify_spawned(const std::string& path) {
  if (g_verifier_exe.empty()) return false;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string v = *e;
    const bool launcher = v.rfind("OMPI_", 0) == 0 || v.rfind("PMIX_", 0) == 0 || v.rfind("PMI_", 0) == 0 ||
                          v.rfind("MPI_LOCALNRANKS=", 0) == 0 || v.rfind("SLURM_PROCID=", 0) == 0;
    if (!launcher) env.push_back(v);
  }
  std::vector<char*> envp, argv;
  for (auto& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string a0 = g_verifier_exe, a1 = "__verify-checkpoint", a2 = path;
  argv = {a0.data(), a1.data(), a2.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);  // dup2 clears close-on-exec on the copy
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  std::fflush(nullptr);
  const int rc = ::posix_spawn(&pid, g_verifier_exe.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return false;
  }
  const std::string rec = read_all(fds[0]);
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  child_verdict(path, rec, st);
  return true;
}

// verify_checkpoint_file in a child process, so a corrupt file that crashes HDF5 (found by the
// soak: a double free on a flipped metadata byte, inside group iteration, which format-1 files
// still need) counts as one that does not verify and the resume falls back to an older one:
// a forked child without MPI, a spawned runner under MPI (verify_spawned).
void verify_isolated(const std::string& path) {
  if (parallel::mpi_launched()) {
    if (!verify_spawned(path)) verify_checkpoint_file(path);
    return;
  }
  int fds[2];
  if (::pipe(fds) != 0) return verify_checkpoint_file(path);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return verify_checkpoint_file(path);
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, 2);
    const std::string rec = verify_record(path);
    const bool ok = ::write(fds[1], rec.data(), rec.size()) == static_cast<ssize_t>(rec.size());
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  const std::string rec = read_all(fds[0]);
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  child_verdict(path, rec, st);
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

}  // namespace

void set_checkpoint_verifier(const std::string& exe) { g_verifier_exe = exe; }

std::string verify_record(const std::string& path) {
  try {
    verify_checkpoint_file(path);
    return "O";
  } catch (const UserError& e) {
    return "E" + e.problem() + std::string(1, '\0') + e.fix();
  } catch (const std::exception& e) {
    return std::string("E") + e.what() + std::string(1, '\0');
  }
}

RunPaths run_paths(const Recipe& r, const std::string& cli_run_dir) {
  RunPaths p;
  p.run_dir = !cli_run_dir.empty() ? cli_run_dir
              : !r.train.run_dir.empty() ? r.train.run_dir
                                         : (fs::path("runs") / r.name).string();
  p.checkpoint_dir = r.checkpoint.dir.empty() ? (fs::path(p.run_dir) / "checkpoints").string() : r.checkpoint.dir;
  return p;
}

std::optional<ResumePoint> choose_resume_point(const std::string& checkpoint_dir, int64_t step, bool strict,
                                               std::shared_ptr<spdlog::logger> log) {
  CheckpointManager mgr(checkpoint_dir, CheckpointConfig{});
  if (log) mgr.set_logger(std::move(log));
  if (!mgr.has_checkpoints()) return std::nullopt;
  const std::vector<std::string> cands = mgr.candidates(step);
  if (cands.empty()) return std::nullopt;
  ResumePoint point;
  std::vector<std::string> failures;
  for (size_t i = 0; i < cands.size(); ++i) {
    const std::string path = (fs::path(checkpoint_dir) / cands[i]).string();
    try {
      verify_isolated(path);
    } catch (const UserError& e) {
      if (strict) throw;
      failures.push_back(e.what());
      point.skipped.push_back(fmt::format("checkpoint {} does not verify: {}", path, e.what()));
      continue;
    }
    point.path = path;
    parse_checkpoint_file_name(cands[i], &point.step);
    if (!point.skipped.empty())
      point.skipped.push_back(fmt::format("resuming from {} (step {}) instead of {}: newer checkpoints did not verify "
                                          "(see above; --strict makes this an error)",
                                          path, point.step, cands[0]));
    return point;
  }
  std::string all;
  for (auto& f : failures) all += "\n  " + f;
  throw UserError(SourceLoc{checkpoint_dir, 0, 0}, "no checkpoint in this directory verifies:" + all,
                  "check them with `runner inspect FILE`; to start over, use a new run directory");
}

ResumeRequest prepare_resume(const std::string& run_dir, const std::vector<std::string>& overrides, int64_t step,
                             bool strict) {
  if (!fs::is_directory(run_dir))
    throw UserError({run_dir, 0, 0}, "not a run directory", "pass the directory `runner train` wrote (runs/NAME)");
  // The checkpoint directory: the run's resolved recipe may place it elsewhere.
  const fs::path saved = fs::path(run_dir) / "recipe.yaml";
  std::string ckpt_dir = run_paths(Recipe{}, run_dir).checkpoint_dir;
  if (fs::exists(saved)) ckpt_dir = run_paths(load_recipe(saved.string()), run_dir).checkpoint_dir;
  std::optional<ResumePoint> point = choose_resume_point(ckpt_dir, step, strict);
  if (!point) {
    // A run killed before its first checkpoint left its temporary file: remove it, unless the
    // directory has a live owner (that one's write is in flight; the trainer says who it is).
    if (auto lock = RunLock::try_take(run_dir)) cleanup_stale(ckpt_dir);
    throw UserError({ckpt_dir, 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
  }
  ResumeRequest req{load_recipe_text(read_recipe_text(point->path), saved.string(), overrides), *point, {}};
  if (overridden(req.recipe, "parallel")) {
    const int64_t dp = req.recipe.parallel.dp, accum = req.recipe.batch.accum;
    std::vector<std::string> again;
    if (!overridden(req.recipe, "parallel.dp")) {
      req.recipe.parallel.dp = 0;
      again.push_back(fmt::format("dp (was {})", dp));
    }
    if (!overridden(req.recipe, "batch")) {
      req.recipe.batch.accum = 0;
      again.push_back(fmt::format("accum (was {})", accum));
    }
    if (!again.empty())
      req.notes.push_back(fmt::format("the overrides change the layout of step {}'s checkpoint: {} derived again for the "
                                      "new layout, global batch {}", point->step, fmt::join(again, " and "),
                                      req.recipe.batch.global));
  }
  return req;
}

CheckpointPolicy::CheckpointPolicy(const Plan& plan, parallel::Grid& grid, std::string checkpoint_dir,
                                   std::shared_ptr<spdlog::logger> log)
    : plan_(plan), grid_(grid), mgr_(std::move(checkpoint_dir), plan.recipe.checkpoint) {
  mgr_.set_logger(std::move(log));
}

int64_t CheckpointPolicy::resume(const ResumePoint& point, TrainState& st) {
  int64_t step = -1;
  agree(grid_.world(), [&] {
    const bool fp32_state = st.params.values.empty() || st.params.values[0].dtype() == ops::DType::F32;
    if (!multi() && fp32_state) {  // the logical tensors are this rank's tensors
      step = mgr_.load_step(point.step, st, /*strict=*/true);
      return;
    }
    // Each rank reads the logical tensors of its own parameters and keeps its slice, so a
    // checkpoint of any layout resumes on this one.
    const parallel::Coords c = grid_.coords();
    TrainState t = logical_template(*plan_.layout, c.pp, grid_.rank(), grid_.world_size());
    mgr_.set_subset_load(true);
    step = mgr_.load_step(point.step, t, /*strict=*/true);
    const int64_t threads = st.omp_threads;
    load_local_from_logical(*plan_.layout, c.pp, c.tp, t, st);
    st.omp_threads = threads;  // this run's, not the checkpoint's
    st.loaded_omp_threads = t.loaded_omp_threads;
  });
  if (multi()) {  // every rank must continue from the same step
    int64_t lo = step, hi = step;
    grid_.world().allreduce_min(&lo, 1);
    grid_.world().allreduce_max(&hi, 1);
    if (lo != hi)
      throw std::runtime_error(fmt::format("ranks loaded different checkpoints (steps {} to {}); is the checkpoint "
                                           "directory on a file system all ranks share?", lo, hi));
  }
  return step;
}

bool CheckpointPolicy::due(int64_t step, double elapsed_seconds) {
  int64_t due = lead() && mgr_.due(step, elapsed_seconds);
  grid_.world().allreduce_max(&due, 1);
  return due != 0;
}

void CheckpointPolicy::save(const TrainState& st, bool final) {
  as_write_error(mgr_.dir(), [&] { save_unchecked(st, final); });
}

void CheckpointPolicy::save_unchecked(const TrainState& st, bool final) {
  if (!multi()) {
    // A 16-bit run stores its fp32 weights (the masters, or the values widened): the logical state.
    const bool fp32_state = st.params.values.empty() || st.params.values[0].dtype() == ops::DType::F32;
    if (fp32_state) mgr_.save(st, final);
    else mgr_.save(fp32_weights_view(st), final);
    if (final) mgr_.wait();
    return;
  }
  if (!plan_.recipe.checkpoint.async || final) {  // each rank writes its slices into the one file
    save_sharded(mgr_, *plan_.layout, grid_, st);
    return;
  }
  TrainState logical = gather_logical_state(*plan_.layout, grid_, st);
  if (lead()) {
    mgr_.save(logical, final);
    if (final) mgr_.wait();
  }
  grid_.world().barrier();  // a final checkpoint is published before any rank exits
}

double CheckpointPolicy::last_stall_ms() const { return lead() ? mgr_.last_stall_seconds() * 1e3 : 0.0; }

void CheckpointPolicy::poll() {
  if (lead()) as_write_error(mgr_.dir(), [&] { mgr_.poll(); });
}

void CheckpointPolicy::remove_stale_files() {
  if (lead()) cleanup_stale(mgr_.dir());
}

}  // namespace runner
