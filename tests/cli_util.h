// Shared by the tests that run the real binary as a user would (test_cli, test_export,
// test_slurm_launch, test_device_select, test_hardening): a shell runner that captures output
// and the exit status, the binary's command line, and a fresh temporary directory per test.
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace cli_util {

struct Result {
  int code = -1;    // exit status, or 128 + signal (as a shell reports it)
  std::string out;  // stdout and stderr together
};

// Runs `cmd` with sh -c, stdout and stderr together.
inline Result sh(const std::string& cmd) {
  Result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// The runner binary with `args`, run in `cwd` when one is given.
inline Result runner_cmd(const std::string& args, const std::string& cwd = "") {
  return sh((cwd.empty() ? "" : "cd '" + cwd + "' && ") + std::string(RUNNER_BINARY) + " " + args);
}

// An empty directory <tmp>/runner_<suite>_<name>_<pid>, removed first if a previous run left it.
inline std::filesystem::path temp_dir(const std::string& suite, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("runner_" + suite + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace cli_util

namespace cli_util {

struct SplitResult {
  int code = -1;
  std::string out;  // stdout alone
  std::string err;  // stderr alone
};

// The runner binary with `args`, stdout and stderr kept apart (stderr through `dir`/stderr.txt).
inline SplitResult runner_split(const std::string& args, const std::filesystem::path& dir) {
  const std::filesystem::path errf = dir / "stderr.txt";
  const Result r = sh("{ " + std::string(RUNNER_BINARY) + " " + args + " 2>'" + errf.string() + "'; }");
  SplitResult s;
  s.code = r.code;
  s.out = r.out;  // the group's 2>&1 (sh's) finds stderr already in the file
  std::FILE* f = std::fopen(errf.c_str(), "rb");
  if (f != nullptr) {
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.err.append(buf, n);
    std::fclose(f);
  }
  return s;
}

}  // namespace cli_util

namespace cli_util {

// The quickstart recipe trained at a tiny size (2 layers, d_model 32, 2 heads, context 32) for
// `steps` steps at learning rate `lr`, with `extra` --set overrides, in <tmp>/runner_<name>_<pid>
// (removed at the end); the run directory is `run`, its one checkpoint at the last step.
struct TinyQuickstartRun {
  std::filesystem::path dir, run;
  TinyQuickstartRun(const std::string& name, int steps, const std::string& lr, const std::string& extra) {
    dir = temp_dir(name, "run");
    run = dir / "run";
    const std::string n = std::to_string(steps);
    const SplitResult r = runner_split("train " + std::string(RUNNER_SOURCE_DIR) + "/recipes/quickstart.yaml --quiet --run-dir " +
                                           run.string() + " --set train.steps=" + n + " train.eval_every=0 checkpoint.every_steps=" + n +
                                           " model.d_model=32 model.n_heads=2 model.seq_len=32 optimizer.lr=" + lr + " " + extra,
                                       dir);
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
  }
  ~TinyQuickstartRun() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace cli_util
