// Reading a checkpoint in a child process (see isolated.h).
#include "runner/checkpoint/isolated.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "parallel/comm.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/file_reader.h"
#include "runner/errors.h"

extern char** environ;

namespace runner {

namespace {

enum class Reader { verify, inspect };

std::string g_verifier_exe;  // set by the runner's main (set_checkpoint_verifier)

std::string error_record(const std::string& problem, const std::string& fix) {
  return "E" + problem + std::string(1, '\0') + fix;
}

// What the child reading `path` for `what` sends (isolated.h: the record).
std::string child_record(Reader what, const std::string& path) {
  try {
    if (what == Reader::verify) {
      verify_checkpoint_file(path);
      return "O";
    }
    bool ok = false;
    std::string text = inspect_checkpoint(path, &ok);
    return (ok ? "O" : "B") + text;
  } catch (const UserError& e) {
    return error_record(e.problem(), e.fix());
  } catch (const std::exception& e) {
    // Verification passes the message on (resume lists it among the files that did not verify);
    // inspect reports the file as unreadable.
    if (what == Reader::verify) return error_record(e.what(), "");
    return error_record(std::string("cannot read the checkpoint: ") + e.what(), ckpt::kCorruptFix);
  }
}

bool write_all(int fd, const std::string& s) {
  for (size_t off = 0; off < s.size();) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

std::string read_all(int fd) {
  std::string rec;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    rec.append(buf, static_cast<size_t>(n));
  }
  return rec;
}

// A finished child: what it sent and how it ended.
struct Child {
  std::string record;
  int status = 0;
};

// Reads the record from `fd` (closing it) and reaps `pid`.
Child finish(pid_t pid, int fd) {
  Child c;
  c.record = read_all(fd);
  ::close(fd);
  while (::waitpid(pid, &c.status, 0) < 0 && errno == EINTR) {
  }
  return c;
}

// A forked child reads. false: it could not be started.
bool forked(Reader what, const std::string& path, Child& out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  if (pid == 0) {
    ::close(fds[0]);
    // What a crash prints (glibc's "free(): invalid pointer") is not the report: the parent says it.
    if (int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, 2);
    const std::string rec = child_record(what, path);
    ::_exit(write_all(fds[1], rec) ? 0 : 1);  // no HDF5 shutdown: the library may hold a corrupt file's handles
  }
  ::close(fds[1]);
  out = finish(pid, fds[0]);
  return true;
}

// Under MPI: the runner binary's hidden `__verify-checkpoint FILE`, started with posix_spawn
// (glibc: clone(CLONE_VM | CLONE_VFORK) + exec, no copy of the rank's address space) and an
// environment without the launcher's variables, so that it does not take itself for an MPI
// rank. false: it could not be started.
bool spawned_verifier(const std::string& path, Child& out) {
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
  std::vector<char*> envp;
  for (auto& v : env) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string a0 = g_verifier_exe, a1 = "__verify-checkpoint", a2 = path;
  std::vector<char*> argv = {a0.data(), a1.data(), a2.data(), nullptr};
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
  out = finish(pid, fds[0]);
  return true;
}

// A child that sent no well-formed record crashed the reader. Resume's log and `runner inspect`
// word it as they always have (tests, the soak and docs/checkpoint-format.md quote them).
UserError crashed(Reader what, const std::string& path, int st) {
  const std::string problem = "checkpoint is corrupt: reading its HDF5 metadata crashed the reader ({})";
  if (what == Reader::verify)
    return UserError({path, 0, 0},
                     fmt::format(fmt::runtime(problem),
                                 WIFSIGNALED(st) ? fmt::format("signal {}", WTERMSIG(st)) : std::string("no verdict")),
                     "use an older checkpoint (runner resume --step N) or start over");
  const std::string why = WIFSIGNALED(st) ? fmt::format("signal {} ({})", WTERMSIG(st), ::strsignal(WTERMSIG(st)))
                                          : fmt::format("exit status {}", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return UserError({path, 0, 0}, fmt::format(fmt::runtime(problem), why), ckpt::kCorruptFix);
}

// The child's verdict: *ok and the report, or its UserError rethrown at `path`.
std::string verdict(Reader what, const std::string& path, const Child& c, bool* ok) {
  const std::string& rec = c.record;
  const bool clean = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0 && !rec.empty();
  if (clean && rec[0] == 'E') {
    const size_t nul = rec.find('\0');
    throw UserError({path, 0, 0}, rec.substr(1, nul == std::string::npos ? std::string::npos : nul - 1),
                    nul == std::string::npos ? std::string() : rec.substr(nul + 1));
  }
  const bool verified = rec == "O";
  if (clean && (what == Reader::verify ? verified : rec[0] == 'O' || rec[0] == 'B')) {
    *ok = rec[0] == 'O';
    return rec.substr(1);
  }
  throw crashed(what, path, c.status);
}

}  // namespace

void set_checkpoint_verifier(const std::string& exe) { g_verifier_exe = exe; }

std::string verify_record(const std::string& path) { return child_record(Reader::verify, path); }

void verify_checkpoint_isolated(const std::string& path) {
  Child c;
  const bool isolated = parallel::mpi_launched() ? spawned_verifier(path, c) : forked(Reader::verify, path, c);
  if (!isolated) return verify_checkpoint_file(path);
  bool ok = false;
  verdict(Reader::verify, path, c, &ok);
}

std::string inspect_checkpoint_isolated(const std::string& path, bool* ok_out) {
  if (ok_out) *ok_out = false;
  Child c;
  if (!forked(Reader::inspect, path, c)) return inspect_checkpoint(path, ok_out);  // cannot isolate: read in-process
  bool ok = false;
  std::string text = verdict(Reader::inspect, path, c, &ok);
  if (ok_out) *ok_out = ok;
  return text;
}

}  // namespace runner
