// Publication: a checkpoint directory's names (step files, LATEST, temporaries) and the end of
// the atomic protocol both writers share (verify, fsync, rename, fsync the directory, LATEST),
// with the fault injection hooks the tests use to crash it at each stage.
// The protocol and why it is crash-safe: docs/checkpoint-format.md, "Writing: atomic publication".
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <fmt/format.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/checkpoint_internal.h"
#include "runner/errors.h"

namespace runner {

namespace fs = std::filesystem;

namespace ckpt {

namespace {

// Fault injection (checkpoint.h's fault points; all off until set).
std::atomic<int64_t> g_fault_bytes{-1};  // -1: off
std::atomic<int> g_fault_stage{static_cast<int>(WriteFault::None)};
std::atomic<bool> g_fault_exit{false};
std::atomic<int64_t> g_slow_ms{0};

int64_t fault_limit() { return g_fault_bytes.load(); }

[[noreturn]] void trigger_fault(const std::string& where) {
  if (g_fault_exit.load()) ::_exit(137);
  throw CheckpointFault("injected checkpoint write fault " + where);
}

void fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(sys_error("cannot open for fsync", p));
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw std::runtime_error(sys_error("cannot fsync", p));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) throw std::runtime_error(sys_error("cannot rename " + from + " to", to));
}

// LATEST := name + "\n", by the same temporary/fsync/rename protocol.
void write_latest(const std::string& dir, const std::string& name) {
  std::string tmp = (fs::path(dir) / fmt::format(".LATEST.tmp.{}", ::getpid())).string();
  std::string final_path = (fs::path(dir) / "LATEST").string();
  try {
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(sys_error("cannot create", tmp));
    std::string text = name + "\n";
    ssize_t w = ::write(fd, text.data(), text.size());
    int rc = (w == static_cast<ssize_t>(text.size())) ? ::fsync(fd) : -1;
    int saved = errno;
    ::close(fd);
    errno = saved;
    if (rc != 0) throw std::runtime_error(sys_error("cannot write", tmp));
    fault_check_stage(WriteFault::BeforeLatestRename);
    rename_or_throw(tmp, final_path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_path(dir, true);
}

}  // namespace

std::string sys_error(const std::string& what, const std::string& path) {
  return fmt::format("checkpoint: {} {}: {}", what, path, std::strerror(errno));
}

void fault_check_bytes(int64_t written) {
  int64_t limit = fault_limit();
  if (limit >= 0 && written >= limit) trigger_fault(fmt::format("after {} bytes of tensor data", written));
}

void fault_check_stage(WriteFault f) {
  if (static_cast<int>(f) == g_fault_stage.load()) trigger_fault(fmt::format("at stage {}", static_cast<int>(f)));
}

std::string temp_path(const std::string& dir, const std::string& name, int64_t pid) {
  return (fs::path(dir) / fmt::format(".{}.tmp.{}", name, pid)).string();
}

void publish(const std::string& tmp, const std::string& dir, const std::string& name, bool latest, bool* renamed) {
  try {
    verify_checkpoint_file(tmp);
  } catch (const UserError& e) {
    throw std::runtime_error(std::string("checkpoint: the file just written does not verify: ") + e.what());
  }
  fsync_path(tmp, false);
  // A slow file system (set_write_slow_ms): the write takes longer before its rename, so a
  // test can signal while a checkpoint is being written (tests/slurm/run.sh).
  if (const int64_t slow = g_slow_ms.load(); slow > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow));
  fault_check_stage(WriteFault::BeforeRename);
  rename_or_throw(tmp, (fs::path(dir) / name).string());
  *renamed = true;
  fsync_path(dir, true);
  if (latest) {
    fault_check_stage(WriteFault::BeforeLatest);
    write_latest(dir, name);
  }
}

}  // namespace ckpt

void set_write_fault_after_bytes(int64_t n) { ckpt::g_fault_bytes.store(n < 0 ? -1 : n); }
void set_write_fault_at(WriteFault where) { ckpt::g_fault_stage.store(static_cast<int>(where)); }
void set_write_fault_exit(bool exit) { ckpt::g_fault_exit.store(exit); }
void set_write_slow_ms(int64_t ms) { ckpt::g_slow_ms.store(ms > 0 ? ms : 0); }

std::string checkpoint_file_name(int64_t step) { return fmt::format("step_{:08d}.h5", step); }

bool parse_checkpoint_file_name(const std::string& name, int64_t* step) {
  if (name.size() < 9 || name.rfind("step_", 0) != 0 || name.substr(name.size() - 3) != ".h5") return false;
  std::string digits = name.substr(5, name.size() - 8);
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  if (step) *step = std::stoll(digits);
  return true;
}

std::vector<int64_t> list_checkpoint_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    int64_t s;
    if (e.is_regular_file(ec) && parse_checkpoint_file_name(e.path().filename().string(), &s)) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string read_latest(const std::string& dir) {
  std::FILE* f = std::fopen((fs::path(dir) / "LATEST").c_str(), "rb");
  if (!f) return "";
  char buf[256];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return parse_checkpoint_file_name(s, nullptr) ? s : "";
}

int cleanup_stale(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  const std::string own = fmt::format(".tmp.{}", ::getpid());
  int removed = 0;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.size() < 2 || n[0] != '.' || n.find(".tmp.") == std::string::npos || !e.is_regular_file(ec)) continue;
    if (n.size() >= own.size() && n.compare(n.size() - own.size(), own.size(), own) == 0) continue;  // ours, in flight
    if (fs::remove(e.path(), ec)) ++removed;
  }
  if (removed) ckpt::fsync_path(dir, true);
  return removed;
}

}  // namespace runner
