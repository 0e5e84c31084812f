// Engineer A's test helpers (a_runs.h).
#include "tests/support/a_runs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace test_support {

bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ready();
}

size_t step_records(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  size_t n = 0;
  for (std::string line; std::getline(in, line);)
    n += line.find("\"loss\"") != std::string::npos && line.find("\"step_ms\"") != std::string::npos;
  return n;
}

std::map<std::string, std::string> tree_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[std::filesystem::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

HeldRunLock::HeldRunLock(const std::filesystem::path& run_dir, const std::string& owner) {
  std::filesystem::create_directories(run_dir);
  fd_ = ::open((run_dir / "runner.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) return;
  const std::string line = owner + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) < 0) {
    // the lock is held all the same
  }
}

HeldRunLock::~HeldRunLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace test_support
