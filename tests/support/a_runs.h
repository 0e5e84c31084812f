// Engineer A's helpers for the tests of work kept (tests/test_work_kept.cpp, test_resume.cpp):
// a runner started with its output in a file (to signal it and read what it said), a whole
// directory's bytes (to show a command changed nothing), and a run-directory lock held by the
// test as another runner would hold it. Design: each helper does one thing the existing
// process.h does not (spawn_runner sends the output to /dev/null), so those stay untouched.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace test_support {

// Starts the runner binary with `args` (no shell), NAME=value `env` added, stdout and stderr
// both into `out_file`.
pid_t spawn_runner_logged(const std::vector<std::string>& args, const std::filesystem::path& out_file,
                          const std::vector<std::string>& env = {});

// Polls `ready` every millisecond until it holds (true) or `limit` has passed (false).
bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds limit);

// The step records of RUN_DIR/metrics.jsonl so far (a record with "loss" and "step_ms").
size_t step_records(const std::filesystem::path& run_dir);

// Every regular file under `dir` (relative path -> bytes): equal maps mean nothing changed.
std::map<std::string, std::string> tree_bytes(const std::filesystem::path& dir);

// Holds RUN_DIR/runner.lock (flock, created with the directory) with `owner` as its line, as
// a live runner does, until the object goes.
class HeldRunLock {
 public:
  HeldRunLock(const std::filesystem::path& run_dir, const std::string& owner);
  ~HeldRunLock();
  HeldRunLock(const HeldRunLock&) = delete;
  HeldRunLock& operator=(const HeldRunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace test_support
