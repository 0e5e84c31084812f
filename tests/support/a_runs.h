// Helpers for the tests of work kept (tests/test_work_kept.cpp, test_resume.cpp): waiting for
// a condition, a whole directory's bytes (to show a command changed nothing), and a
// run-directory lock held by the test as another runner would hold it. (A runner started with its output in a file is
// process.h's spawn_runner with an out_file.)
#pragma once
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace test_support {

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
