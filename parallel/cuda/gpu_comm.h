// Communicators for the CUDA backend (built only with RUNNER_HAVE_NCCL).
//
// Both take DEVICE pointers for the buffer collectives (allreduce/allgather/reduce-scatter of
// float and typed buffers, send/recv and their non-blocking forms) and HOST pointers for the
// scalar reductions (double, int64), broadcast and barrier, which go to the bootstrap (MPI or
// one-rank) communicator: those carry losses, counters and checkpoint metadata, which live on
// the host.
//
//   nccl_comm         NCCL on its own communication stream, ordered after the backend's
//                     compute stream by an event. MPI (the bootstrap) only distributes the
//                     NCCL unique id. One rank per GPU (NCCL cannot put two on one device).
//   host_staged_comm  copies device buffers to host memory, runs the bootstrap's own
//                     collective, copies back: several ranks may share one GPU (the layouts
//                     are testable on a one-GPU machine), at host-memory speed.
//
// Status: compiled and linked without a GPU; not yet run on one (tests/cuda/test_cuda_comm).
#pragma once
#include <memory>

#include "parallel/comm.h"

namespace parallel {

std::unique_ptr<Communicator> nccl_comm(std::unique_ptr<Communicator> bootstrap);
std::unique_ptr<Communicator> host_staged_comm(std::unique_ptr<Communicator> bootstrap);

}  // namespace parallel
