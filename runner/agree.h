// Errors every rank agrees on.
//
// A user error found by one rank (a data file it cannot open, a checkpoint it cannot read)
// must end the whole job with exit code 2 and one message, not leave the other ranks waiting
// in a collective. agree() runs a piece of work on every rank and compares notes: if any rank
// threw a UserError, the lowest such rank throws AgreedUserError (and prints it) and every
// other rank throws SilentExit.
#pragma once
#include <optional>

#include "parallel/comm.h"
#include "runner/errors.h"

namespace runner {

// This rank ends with `code` without printing: another rank prints why.
struct SilentExit {
  int code;
};
// A user error that every rank has agreed on (all stop with code 2; this rank prints it).
struct AgreedUserError : UserError {
  explicit AgreedUserError(const UserError& e) : UserError(e) {}
};

// Runs `f` on every rank of `world` (a collective). On one rank, a UserError passes through.
template <class F>
void agree(parallel::Communicator& world, F&& f) {
  std::optional<UserError> err;
  try {
    f();
  } catch (const UserError& e) {
    err = e;
  }
  if (world.size() == 1) {
    if (err) throw *err;
    return;
  }
  int64_t first = err ? world.rank() : world.size();
  world.allreduce_min(&first, 1);
  if (first == world.size()) return;
  if (world.rank() == first) throw AgreedUserError(*err);
  throw SilentExit{kExitUserError};
}

}  // namespace runner
