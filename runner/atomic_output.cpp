// Publishing outputs whole, one writer each (see atomic_output.h).
#include "runner/atomic_output.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

// The target as an absolute path without a trailing separator ("out/" and "out" are one output).
fs::path normal(const std::string& target) {
  if (target.empty()) throw UserError({}, "no output path given", "name the output");
  fs::path p = fs::absolute(fs::path(target)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p == p.root_path() || p.filename() == "." || p.filename() == "..")
    throw UserError({target}, "is not a path an output can be published at (a directory is replaced as a whole)",
                    "name a new directory for the output");
  return p;
}

std::string sibling(const fs::path& target, const std::string& kind, long pid) {
  return (target.parent_path() / ("." + target.filename().string() + "." + kind + "." + std::to_string(pid))).string();
}

std::string errno_text() { return std::strerror(errno); }

void fsync_or_throw(const std::string& p, bool dir) {
  const int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw UserError({p}, "cannot open to sync: " + errno_text(), "check the file system");
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw UserError({p}, "cannot sync to disk: " + errno_text(), "check free space and the file system");
}

// Whether `path` is `dir` or lies under it, symbolic links resolved.
bool within(const std::string& path, const std::string& dir) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec), d = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

// A live process with this PID (EPERM: alive, another user's).
bool alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// The PID at the end of a temporary's name after `prefix`; -1 when the rest is not digits.
long pid_after(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 9) return -1;
  for (char c : digits)
    if (c < '0' || c > '9') return -1;
  return std::stol(digits);
}

// renameat2 with flags through the system call (glibc's wrapper is recent); -1 with errno on failure.
int rename2(const std::string& from, const std::string& to, unsigned flags) {
#ifdef SYS_renameat2
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
#else
  (void)from, (void)to, (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}
constexpr unsigned kNoReplace = 1, kExchange = 2;  // RENAME_NOREPLACE, RENAME_EXCHANGE

}  // namespace

// ---- the lock ----

OutputLock::OutputLock(const std::string& target, const std::string& what) {
  const fs::path t = normal(target);
  std::error_code ec;
  fs::create_directories(t.parent_path(), ec);
  if (ec) throw UserError({t.parent_path().string()}, "cannot create the directory: " + ec.message(), "check the path and permissions");
  path_ = (t.parent_path() / ("." + t.filename().string() + ".lock")).string();
  // The lock file is removed on release, so a writer may lock a file that the previous owner
  // has just unlinked: it then checks that the path still names the file it locked, and retries.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw UserError({path_}, "cannot create the lock file of " + t.string() + ": " + errno_text(),
                      "check that its directory is writable");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char buf[256] = {0};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      fd_ = -1;
      std::string owner = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
      while (!owner.empty() && owner.back() == '\n') owner.pop_back();
      if (e != EWOULDBLOCK) throw UserError({path_}, std::string("cannot lock: ") + std::strerror(e), "check the file system");
      throw UserError({t.string()}, what + " output is being written by another runner (" +
                                        (owner.empty() ? "it has not recorded itself yet" : owner) + ")",
                      "wait for it to finish, or write to another path");
    }
    struct stat a{}, b{};
    if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) break;
    ::close(fd_);
    fd_ = -1;
  }
  if (fd_ < 0) throw UserError({path_}, "the lock file keeps changing under this runner", "retry");
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::string line = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) < 0) {
    // The lock holds all the same; only the owner's name is missing for a second writer.
  }
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked: a writer that opened it re-checks the path
  ::close(fd_);
}

// ---- temporaries ----

int sweep_stale_temporaries(const std::string& target) {
  const fs::path t = normal(target);
  const std::string name = t.filename().string();
  const std::string prefixes[] = {"." + name + ".tmp.", "." + name + ".old.", name + ".tmp-", name + ".old-", name + ".tmp."};
  std::error_code ec;
  int removed = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(t.parent_path(), ec)) {
    const std::string n = e.path().filename().string();
    for (const std::string& p : prefixes) {
      const long pid = pid_after(n, p);
      if (pid < 0 || alive(pid)) continue;
      std::error_code rc;
      if (fs::remove_all(e.path(), rc) > 0) ++removed;
      break;
    }
  }
  return removed;
}

void sync_tree(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_symlink(ec)) continue;
    if (it->is_regular_file(ec)) fsync_or_throw(it->path().string(), false);
    else if (it->is_directory(ec)) fsync_or_throw(it->path().string(), true);
  }
  if (ec) throw UserError({dir}, "cannot list the output to sync it: " + ec.message(), "check the file system");
  fsync_or_throw(dir, true);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const fs::path t = normal(path);
  const std::string tmp = sibling(t, "tmp", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError({path}, "cannot create " + tmp + ": " + errno_text(), "check the directory's permissions");
  size_t done = 0;
  int err = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      err = w < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<size_t>(w);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), t.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw UserError({path}, std::string("cannot write the file: ") + std::strerror(err),
                    "check free space and permissions; the previous file, if any, is unchanged");
  }
  fsync_or_throw(t.parent_path().string(), true);
}

// ---- a directory output ----

StagedDir::StagedDir(const std::string& target, bool force, const std::string& what, const std::string& force_flag,
                     const std::vector<std::string>& inputs)
    : target_(normal(target).string()), lock_(target, what) {
  sweep_stale_temporaries(target_);
  std::error_code ec;
  std::vector<std::string> kept = inputs;
  kept.push_back(fs::current_path(ec).string());
  for (const std::string& in : kept)
    if (!in.empty() && within(in, target_))
      throw UserError({target}, "holds " + (&in == &kept.back() ? "the working directory" : in) + ", which " + what +
                                    " would delete by replacing it",
                      "write the output to a new directory of its own");
  if (fs::exists(target_, ec) && !fs::is_directory(target_, ec))
    throw UserError({target}, "exists and is not a directory (" + what + " writes a directory)",
                    "choose another output, or remove the file");
  if (fs::is_directory(target_, ec) && !fs::is_empty(target_, ec) && !force)
    throw UserError({target}, "is not empty: " + what + " does not overwrite an existing output",
                    "pass " + force_flag + " to replace it (once the new one is complete), or choose another output");
  tmp_ = sibling(fs::path(target_), "tmp", ::getpid());
  fs::remove_all(tmp_, ec);
  if (!fs::create_directory(tmp_, ec))
    throw UserError({target}, "cannot create " + tmp_ + ": " + (ec ? ec.message() : "it exists"), "check permissions");
}

StagedDir::~StagedDir() {
  if (committed_ || tmp_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void StagedDir::commit() {
  sync_tree(tmp_);
  std::error_code ec;
  const bool exists = fs::exists(target_, ec);
  const std::string parent = fs::path(target_).parent_path().string();
  if (!exists) {
    if (rename2(tmp_, target_, kNoReplace) != 0) {
      if (errno != EINVAL && errno != ENOSYS)
        throw UserError({target_}, "cannot move the new output into place: " + errno_text(), "check permissions");
      if (::rename(tmp_.c_str(), target_.c_str()) != 0)
        throw UserError({target_}, "cannot move the new output into place: " + errno_text(), "check permissions");
    }
    committed_ = true;
    fsync_or_throw(parent, true);
    return;
  }
  // Swapped in one step: the old output is whole at the target until the new one is.
  if (rename2(tmp_, target_, kExchange) == 0) {
    committed_ = true;
    fsync_or_throw(parent, true);
    fs::remove_all(tmp_, ec);  // now the old output
    return;
  }
  if (errno != EINVAL && errno != ENOSYS)
    throw UserError({target_}, "cannot swap the new output in: " + errno_text(), "check permissions");
  // A file system without the exchange: the old one aside, the new one in, the old one removed.
  const std::string old = sibling(fs::path(target_), "old", ::getpid());
  fs::remove_all(old, ec);
  if (::rename(target_.c_str(), old.c_str()) != 0)
    throw UserError({target_}, "cannot move the previous output aside: " + errno_text(), "check permissions");
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const std::string why = errno_text();
    if (::rename(old.c_str(), target_.c_str()) != 0) {
      // the previous output stays whole at `old`, named in the message
    }
    throw UserError({target_}, "cannot move the new output into place: " + why, "check permissions");
  }
  committed_ = true;
  fsync_or_throw(parent, true);
  fs::remove_all(old, ec);
}

// ---- a file output ----

StagedFile::StagedFile(const std::string& target, bool force, const std::string& what, const std::string& force_flag)
    : target_(normal(target).string()), lock_(target, what) {
  sweep_stale_temporaries(target_);
  std::error_code ec;
  if (fs::is_directory(target_, ec))
    throw UserError({target}, "is a directory (" + what + " writes a file)", "name a file");
  if (fs::exists(target_, ec) && !force)
    throw UserError({target}, "exists: " + what + " does not overwrite it", "pass " + force_flag + " to replace it, or choose another path");
}

void StagedFile::commit(std::string_view bytes) { write_file_atomic(target_, bytes); }

}  // namespace runner
