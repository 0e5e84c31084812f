// One owner per run directory: an advisory lock file, RUN_DIR/runner.lock.
//
// `runner train` and `runner resume` take it (rank 0 alone under MPI) before they read a
// checkpoint or write recipe.yaml, metrics.jsonl or a checkpoint. The lock is flock(2) on the
// file, so the kernel releases it when the owner exits in any way (a crash or SIGKILL too);
// the file records the owner (host, pid, Slurm job, start time) so a second run can name it.
// A lock file left by a dead owner is simply taken over, with a message. On a clean exit the
// owner empties the file.
#pragma once
#include <optional>
#include <string>

namespace runner {

class RunLock {
 public:
  // Takes the lock of `run_dir` (created if missing). Throws UserError naming the live owner
  // when another process holds it, or when the directory cannot be created or the lock file
  // opened. `took_over`: what the file said about a previous owner that is gone (empty: none).
  explicit RunLock(const std::string& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Takes the lock if it is free; nullopt when another process holds it (or it cannot be
  // opened). For callers that only tidy up when nobody owns the directory.
  static std::optional<RunLock> try_take(const std::string& run_dir);
  RunLock(RunLock&& o) noexcept;

  // The owner's line ("host H pid P ... since T", or "" when it has not recorded itself yet)
  // when another process holds the lock of `run_dir`; nullopt when nobody does (or there is no
  // lock file). Takes nothing and writes nothing.
  static std::optional<std::string> holder(const std::string& run_dir);
  // Throws the UserError a second runner gets on a directory `owner` holds (holder()'s line).
  [[noreturn]] static void throw_in_use(const std::string& run_dir, const std::string& owner);

  const std::string& path() const { return path_; }
  const std::string& took_over() const { return took_over_; }
  // "host H pid P[ slurm job J] since T": this process as the file records it.
  static std::string owner_line();

 private:
  struct NoThrow {};
  RunLock(const std::string& run_dir, NoThrow);
  std::string path_, took_over_;
  int fd_ = -1;
};

}  // namespace runner
