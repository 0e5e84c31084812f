// User-facing errors.
//
// Anything a user can cause (a recipe, a data file, a checkpoint, a world size) throws
// UserError; the CLI prints it as `file:line:col: what; how to fix` and exits with
// code 2 before anything is allocated or written. Broken internal invariants use
// RUNNER_CHECK, which aborts loudly with where it happened.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace runner {

struct SourceLoc {
  std::string file;  // empty when the problem has no file (e.g. --set on the command line)
  int line = 0;      // 1-based; 0 when unknown
  int col = 0;       // 1-based; 0 when unknown
  std::string str() const;  // "file:line:col" (parts omitted when unknown)
};

class UserError : public std::runtime_error {
 public:
  // One problem: where, what is wrong, how to fix it.
  struct Entry {
    SourceLoc loc;
    std::string what, fix;
  };
  UserError(SourceLoc loc, std::string what, std::string fix = "")
      : std::runtime_error(format(loc, what, fix)), loc_(std::move(loc)), what_(std::move(what)), fix_(std::move(fix)) {}
  // Several independent problems found in one pass (a recipe's): loc(), problem()
  // and fix() are the first one's; what() is one `file:line:col: what; fix` line per problem,
  // in the given order, then a count. `all` must not be empty.
  explicit UserError(std::vector<Entry> all);
  const SourceLoc& loc() const { return loc_; }
  const std::string& problem() const { return what_; }
  const std::string& fix() const { return fix_; }
  // Every problem this error carries (one entry for a single problem).
  std::vector<Entry> all() const { return more_.empty() ? std::vector<Entry>{{loc_, what_, fix_}} : more_; }
  static std::string format(const SourceLoc& loc, const std::string& what, const std::string& fix);

 private:
  static std::string format_all(const std::vector<Entry>& all);
  SourceLoc loc_;
  std::string what_, fix_;
  std::vector<Entry> more_;  // every problem when there are several; empty for one
};

constexpr int kExitUserError = 2;
// The run stopped on its numerics: fp16 gradients overflowed on more consecutive steps than
// precision.loss_scale.max_consecutive_skips allows (the diagnostic names the tensor).
constexpr int kExitNumerics = 4;
// The watchdog stopped a hung run: a collective, send or receive (or a whole step) took longer
// than train.collective_timeout; the message and events.jsonl name who did not arrive (docs/slurm.md).
constexpr int kExitHang = 5;
// A job Slurm requeued by itself (a lost node) refused to continue at start (train.max_restarts
// reached, or no progress since the last failure) and recorded why: the batch script neither
// requeues nor records it again (runner/run/restart.h).
constexpr int kExitNoRestart = 6;

[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace runner

#define RUNNER_CHECK(cond, msg) \
  do { if (!(cond)) ::runner::check_failed(#cond, __FILE__, __LINE__, (msg)); } while (0)
