// Publishing what a command writes: a file or a directory appears at its path only when it is
// complete, an existing one is replaced only when asked (--force) and only once the new one is
// complete, and one output has one writer at a time.
//
// Design: everything is built beside the target, in `.NAME.tmp.PID` (same directory, so the same
// file system and an atomic rename), fsynced, then renamed over it (a directory is swapped in
// with renameat2(RENAME_EXCHANGE), so the old one stays whole until the new one is in place,
// then removed). The writer holds an advisory lock, `.NAME.lock` beside the target (flock(2):
// the kernel drops it when the writer dies in any way), from before its first check to after
// the rename; a second writer is refused, naming the first. A temporary left by a writer that
// died (SIGKILL, a second signal, a crash) is removed by the next writer of that output, and
// only when its owner's PID is gone. Checkpoints keep their own protocol (runner/checkpoint/
// publish.cpp: verify before the rename, LATEST); this is for every other output.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace runner {

// The advisory lock of one output path: `.NAME.lock` in its directory. Throws UserError naming
// the owner when another process holds it. The lock file is removed on release.
class OutputLock {
 public:
  OutputLock(const std::string& target, const std::string& what);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Removes the temporaries of `target` that earlier writers left (`.NAME.tmp.PID`,
// `.NAME.old.PID`, and the older `NAME.tmp-PID`, `NAME.old-PID`, `NAME.tmp.PID`) whose PID is not a live
// process. Call it holding the output's lock. Returns how many it removed.
int sweep_stale_temporaries(const std::string& target);

// One file, written whole: bytes to `.NAME.tmp.PID`, fsync, rename, fsync the directory. The
// directory must exist. Throws UserError (the path, the system's reason) and leaves no
// temporary when the write fails (ENOSPC, EIO): the previous file stays as it was.
void write_file_atomic(const std::string& path, std::string_view bytes);

// fsync of every file and directory under `dir`, and `dir` itself.
void sync_tree(const std::string& dir);

// A directory output built beside its target and swapped in by commit().
//   StagedDir out(opt.out, opt.force, "data prepare", "--force");
//   write into out.path() ...
//   out.commit();
// The constructor takes the target's lock, sweeps dead writers' temporaries, refuses a target
// that is a file, or a non-empty directory without `force` (UserError naming `force_flag`), or
// one holding the working directory or any of `inputs` (replacing it would delete them), and
// creates the temporary. Unless committed, the destructor removes the temporary: an
// exception or a stop signal unwinding through it leaves the target as it was.
class StagedDir {
 public:
  StagedDir(const std::string& target, bool force, const std::string& what, const std::string& force_flag = "--force",
            const std::vector<std::string>& inputs = {});
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& path() const { return tmp_; }
  const std::string& target() const { return target_; }
  // Syncs the temporary's tree, puts it at the target (the old target, if any, removed after).
  void commit();

 private:
  std::string target_, tmp_;
  OutputLock lock_;
  bool committed_ = false;
};

// A file output with the same rules (lock, sweep, --force), written by commit(bytes).
class StagedFile {
 public:
  StagedFile(const std::string& target, bool force, const std::string& what, const std::string& force_flag = "--force");
  void commit(std::string_view bytes);
  const std::string& target() const { return target_; }

 private:
  std::string target_;
  OutputLock lock_;
};

}  // namespace runner
