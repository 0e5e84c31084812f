// Spawning the runner binary and mpirun from tests (process.h). RUNNER_BINARY and
// RUNNER_MPIEXEC come from the build (CMakeLists.txt, runner_test_support).
#include "tests/support/process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include <doctest/doctest.h>

#include "tests/support/temp_dir.h"

namespace test_support {

namespace {

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

std::string binary() { return RUNNER_BINARY; }

Result sh(const std::string& cmd) {
  Result r;
  // The braces take stderr of every command in `cmd`, not only of its last (the newline lets
  // `cmd` end in `&` or a comment).
  FILE* p = ::popen(("{ " + cmd + "\n} 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  r.code = exit_code(::pclose(p));
  return r;
}

Result runner_cmd(const std::string& args, const std::string& cwd) {
  return sh((cwd.empty() ? "" : "cd '" + cwd + "' && ") + binary() + " " + args);
}

Result runner_ok(const std::string& args, const std::string& cwd) {
  Result r = runner_cmd(args, cwd);
  REQUIRE_MESSAGE(r.code == 0, "runner " << args << "\n" << r.out);
  return r;
}

SplitResult runner_split(const std::string& args, const std::filesystem::path& dir, const std::string& prefix) {
  const std::filesystem::path errf = dir / "stderr.txt";
  const Result r = sh("{ " + prefix + binary() + " " + args + " 2>'" + errf.string() + "'; }");
  // The group's 2>&1 (sh's) finds stderr already in the file: `out` is stdout alone.
  return SplitResult{r.code, r.out, slurp(errf)};
}

std::string mpirun(int np) {
  return std::string("timeout 300 ") + RUNNER_MPIEXEC + " -np " + std::to_string(np) + " --oversubscribe -x OMP_NUM_THREADS=1 ";
}

std::string launcher(int np) { return np > 0 ? mpirun(np) : std::string("OMP_NUM_THREADS=1 timeout 300 "); }

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string w; in >> w;) v.push_back(w);
  return v;
}

pid_t spawn_runner(const std::vector<std::string>& args, const std::vector<std::string>& env,
                   const std::filesystem::path& out_file) {
  const std::string out = out_file.empty() ? std::string("/dev/null") : out_file.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const std::string& e : env) ::putenv(::strdup(e.c_str()));
    std::string bin = binary();
    std::vector<std::string> copy = args;
    std::vector<char*> argv{bin.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return exit_code(st);
}

bool signal_when(pid_t pid, int sig, const std::function<bool()>& ready, int tries) {
  for (int i = 0; i < tries; ++i) {
    if (ready()) {
      ::kill(pid, sig);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

}  // namespace test_support
