// Temporary directories for tests: one RAII type for a directory a test (or a whole test binary)
// owns, and fresh named directories for the command-line tests. Design: every directory lives
// under the system's temporary folder and is removed when its owner goes (the object, or the
// test process for fresh_dir), unless RUNNER_KEEP_TEST_DIRS is set, so a failing test's files
// can be looked at; a forked child never removes what its parent made.
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>

namespace test_support {

namespace fs = std::filesystem;

// A new, empty, uniquely named directory <tmp>/runner_<name>_XXXXXX, removed with the object.
// Usable where a path is: `dir / "file"`, `dir.path`, `dir.string()`.
class TempDir {
 public:
  explicit TempDir(const std::string& name = "test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  fs::path path;

  fs::path operator/(const std::string& name) const { return path / name; }
  operator const fs::path&() const { return path; }  // NOLINT: a TempDir is used as its path
  std::string string() const { return path.string(); }
  std::string file(const std::string& name) const { return (path / name).string(); }

 private:
  pid_t owner_;
};

// An empty directory <tmp>/runner_<suite>_<name>_<pid> (emptied if a previous run left it),
// removed when the test process exits. For tests that name their directories per case.
fs::path fresh_dir(const std::string& suite, const std::string& name);

// A whole file as bytes ("" when it cannot be read).
std::string slurp(const fs::path& p);

}  // namespace test_support
