// A training job's processes (see launch.h).
#include "runner/train/launch.h"

#include <cstdio>
#include <cstdlib>

#include "parallel/grid.h"
#include "runner/agree.h"

namespace runner {

namespace {

// Prints this rank's message, named by its coordinates, and stops the whole job.
[[noreturn]] void fail_job(parallel::Grid& grid, const std::string& message, int code) {
  std::fprintf(stderr, "[rank %d %s] %s\n", grid.rank(), grid.name().c_str(), message.c_str());
  std::fflush(stderr);
  grid.world().abort(code);
  std::_Exit(code);  // not reached (abort() is [[noreturn]], which GCC does not see through a virtual call)
}

}  // namespace

Launch::Launch(int* argc, char*** argv) {
  if (!parallel::mpi_launched()) return;
  parallel::init_mpi(argc, argv);
  world_ = parallel::mpi_world();
  rank_ = world_->rank();
  size_ = world_->size();
}

Launch::~Launch() { parallel::finalize_mpi(); }

int Launch::train(const Plan& p, const TrainOptions& opts) {
  if (!world_) return run_training(p, opts);
  parallel::Grid grid(std::move(world_), {static_cast<int>(p.dp), static_cast<int>(p.tp), static_cast<int>(p.pp)});
  try {
    return run_training(p, opts, grid);
  } catch (const SilentExit& e) {
    return e.code;
  } catch (const AgreedUserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitUserError;
  } catch (const UserError& e) {  // this rank's alone: the others may be waiting in a collective
    fail_job(grid, e.what(), kExitUserError);
  } catch (const std::exception& e) {
    fail_job(grid, std::string("error: ") + e.what(), 1);
  }
}

}  // namespace runner
