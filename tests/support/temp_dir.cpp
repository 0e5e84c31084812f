// Temporary directories for tests (temp_dir.h). The directories fresh_dir hands out are kept in
// one process-wide list and removed at exit by the process that made them.
#include "tests/support/temp_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "ops/knobs.h"

namespace test_support {

namespace {

bool keep_dirs() { return ops::knobs().keep_test_dirs; }

void remove_dir(const fs::path& p, pid_t owner) {
  if (keep_dirs() || ::getpid() != owner) return;
  std::error_code ec;
  fs::remove_all(p, ec);
}

// fresh_dir's directories, removed when the process exits.
struct FreshDirs {
  pid_t owner = ::getpid();
  std::vector<fs::path> dirs;
  ~FreshDirs() {
    for (const fs::path& d : dirs) remove_dir(d, owner);
  }
};

FreshDirs& fresh_dirs() {
  static FreshDirs d;
  return d;
}

}  // namespace

TempDir::TempDir(const std::string& name) : owner_(::getpid()) {
  std::string tmpl = (fs::temp_directory_path() / ("runner_" + name + "_XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path = tmpl;
}

TempDir::~TempDir() { remove_dir(path, owner_); }

fs::path fresh_dir(const std::string& suite, const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("runner_" + suite + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fresh_dirs().dirs.push_back(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace test_support
