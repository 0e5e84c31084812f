// Spawning the runner binary (and mpirun) from a test, with its output, its exit status and a
// time limit. Design: commands go through `sh -c` (popen), so a test writes a command line as a
// user would, environment assignments and redirections included; the few tests that must
// signal the process they started (SIGKILL, SIGTERM mid-run) fork and exec it instead
// (spawn_runner). Exit codes read as a shell reports them: the status, or 128 + signal.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace test_support {

struct Result {
  int code = -1;    // exit status, or 128 + signal
  std::string out;  // stdout and stderr together
};

struct SplitResult {
  int code = -1;
  std::string out;  // stdout alone
  std::string err;  // stderr alone
};

// The runner binary under test (its absolute path).
std::string binary();

// Runs `cmd` with sh -c, stdout and stderr (of every command in it) together.
Result sh(const std::string& cmd);

// The runner binary with `args`, run in `cwd` when one is given.
Result runner_cmd(const std::string& args, const std::string& cwd = "");

// runner_cmd(args, cwd) REQUIRE-d to exit 0, its command and output in the failure message.
Result runner_ok(const std::string& args, const std::string& cwd = "");

// `prefix runner ARGS` with stdout and stderr kept apart (stderr through `dir`/stderr.txt);
// `prefix` is an environment assignment or a launcher such as mpirun(2).
SplitResult runner_split(const std::string& args, const std::filesystem::path& dir, const std::string& prefix = "");

// "timeout 300 mpiexec -np N --oversubscribe -x OMP_NUM_THREADS=1 ": one OpenMP thread per rank
// (the ctest environment allows root and oversubscription); the 300 s limit makes a hang fail
// the test instead of CI.
std::string mpirun(int np);

// The prefix that starts `np` ranks: mpirun(np), or for np 0 one plain process with one OpenMP
// thread under the same time limit.
std::string launcher(int np);

// The words of `s` split at white space (for spawn_runner's argument vectors).
std::vector<std::string> split(const std::string& s);

// Starts the runner binary with `args` (each one argument, no shell), NAME=value `env` added,
// stdout and stderr both into `out_file` (empty: /dev/null); returns its pid. For tests that
// signal the process (and read what it said).
pid_t spawn_runner(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                   const std::filesystem::path& out_file = {});

// Waits for `pid`; its exit status, or 128 + signal.
int wait_exit(pid_t pid);

// Checks `ready` every 200 microseconds, at most `tries` times, and sends `sig` to `pid` as soon
// as it holds; whether it did. For killing a spawned run at a chosen point (a checkpoint).
bool signal_when(pid_t pid, int sig, const std::function<bool()>& ready, int tries);

}  // namespace test_support
