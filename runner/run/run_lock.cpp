// One owner per run directory (see run_lock.h).
#include "runner/run/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

std::string read_all(int fd) {
  std::string s;
  char buf[512];
  if (::lseek(fd, 0, SEEK_SET) < 0) return s;
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0 && s.size() < 4096;) s.append(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

enum class Outcome { Taken, Held, Failed };

// Opens and locks RUN_DIR/runner.lock. Taken: `fd` holds the lock and the file records this
// process; `previous` what it said before (a dead owner's line, or empty). Held: `previous` is
// the live owner's line. Failed: `previous` is why.
Outcome acquire(const std::string& run_dir, std::string& path, int& fd, std::string& previous) {
  path = (fs::path(run_dir) / "runner.lock").string();
  fd = -1;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) {
    previous = fmt::format("cannot create the run directory: {}", ec.message());
    return Outcome::Failed;
  }
  fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    previous = fmt::format("cannot open the lock file: {}", std::strerror(errno));
    return Outcome::Failed;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    previous = read_all(fd);
    ::close(fd);
    fd = -1;
    if (e == EWOULDBLOCK) return Outcome::Held;
    previous = fmt::format("cannot lock {}: {}", path, std::strerror(e));
    return Outcome::Failed;
  }
  previous = read_all(fd);
  const std::string line = RunLock::owner_line() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size())) {
    // The lock is held all the same; only the owner's name is missing for a second run.
  }
  return Outcome::Taken;
}

}  // namespace

std::string RunLock::owner_line() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  std::string s = fmt::format("host {} pid {}", host, ::getpid());
  if (const char* job = std::getenv("SLURM_JOB_ID"); job && *job) s += fmt::format(" slurm job {}", job);
  char when[64];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return s + " since " + when;
}

RunLock::RunLock(const std::string& run_dir) {
  std::string previous;
  switch (acquire(run_dir, path_, fd_, previous)) {
    case Outcome::Taken:
      took_over_ = previous;
      return;
    case Outcome::Held:
      throw_in_use(run_dir, previous);
    case Outcome::Failed:
      throw UserError({path_, 0, 0}, previous, "check the run directory's path and permissions (--run-dir)");
  }
}

void RunLock::throw_in_use(const std::string& run_dir, const std::string& owner) {
  throw UserError({(fs::path(run_dir) / "runner.lock").string(), 0, 0},
                  fmt::format("the run directory {} is in use by another runner ({})", run_dir,
                              owner.empty() ? "its owner has not recorded itself yet" : owner),
                  "wait for that run to finish or stop it, or train in another directory (--run-dir)");
}

std::optional<std::string> RunLock::holder(const std::string& run_dir) {
  const std::string path = (fs::path(run_dir) / "runner.lock").string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> owner;
  // A shared lock is refused while an owner holds the exclusive one; when it is granted it is
  // dropped at once, so a runner starting now is never kept out.
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) owner = read_all(fd);
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return owner;
}

RunLock::RunLock(const std::string& run_dir, NoThrow) {
  std::string previous;
  if (acquire(run_dir, path_, fd_, previous) != Outcome::Taken) fd_ = -1;
}

std::optional<RunLock> RunLock::try_take(const std::string& run_dir) {
  RunLock l(run_dir, NoThrow{});
  if (l.fd_ < 0) return std::nullopt;
  return std::optional<RunLock>(std::move(l));
}

RunLock::RunLock(RunLock&& o) noexcept : path_(std::move(o.path_)), took_over_(std::move(o.took_over_)), fd_(o.fd_) {
  o.fd_ = -1;
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) != 0) {
    // a stale line only makes the next owner say it took over
  }
  ::close(fd_);  // releases the flock
}

}  // namespace runner
