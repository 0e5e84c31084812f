// The main() of the tests run under mpiexec (tests/mpi/test_mpi_*.cpp): every rank runs the
// doctest cases (so every rank makes the same collective calls), rank 0 prints in full and the
// others only their failures, and the job fails on every rank if any rank failed.
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>

#include "parallel/comm.h"

namespace mpi_doctest {

// Runs the cases after MPI is initialised; sets *rank to this world rank first. Returns the
// process exit code. The caller initialises and finalises MPI around it.
inline int run(int argc, char** argv, const char* name, int* rank) {
  int64_t failed = 0;
  auto world = parallel::mpi_world();
  *rank = world->rank();
  doctest::Context ctx;
  ctx.setOption("no-colors", true);                // mpirun gives ranks a pty; logs want plain text
  if (*rank != 0) ctx.setOption("minimal", true);  // only failures from the other ranks
  ctx.applyCommandLine(argc, argv);
  const int rc = ctx.run();
  failed = rc != 0 ? 1 : 0;
  if (ctx.shouldExit()) failed = 0;
  world->allreduce_sum(&failed, 1);
  if (*rank == 0 && failed) std::fprintf(stderr, "%s: %lld rank(s) failed\n", name, static_cast<long long>(failed));
  return failed ? 1 : 0;
}

}  // namespace mpi_doctest
