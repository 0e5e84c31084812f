// Communicators for the CUDA backend (built only with RUNNER_HAVE_NCCL).
//
// A communicator's own calls take host memory (scalars, metrics, checkpoint staging: they go
// to the bootstrap, MPI); its tensors() face takes device memory (parallel/comm.h).
//
//   nccl_comm         tensors() on NCCL, on its own communication stream ordered after the
//                     backend's compute stream by events (blocking calls make the compute
//                     stream wait for them; non-blocking ones complete with their event), with
//                     the same buckets and overlap as the MPI path (parallel/grad_sync.h).
//                     Point-to-point messages use two more NCCL communicators, one per
//                     direction, so the pipeline's sends up and down never block each other.
//                     MPI (the bootstrap) only distributes the NCCL unique id. One rank per GPU.
//   host_staged_comm  the bootstrap itself with the CUDA backend as its device: tensors()
//                     stages device buffers through host memory (parallel/tensor_comm.cpp), so
//                     several ranks may share one GPU (the layouts are testable on a one-GPU
//                     machine), at host-memory speed.
//   gpu_world         the run's choice (runner/train/mpi_job.cpp, for a GPU device): host-staged
//                     when RUNNER_HOST_STAGED_COMM=1 or when two ranks use the same GPU (checked
//                     across the job, collectively), else NCCL. *how says which.
//
// Status: compiled and linked without a GPU; not yet run on one (tests/cuda/test_cuda_comm).
#pragma once
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace parallel {

std::unique_ptr<Communicator> nccl_comm(std::unique_ptr<Communicator> bootstrap);
std::unique_ptr<Communicator> host_staged_comm(std::unique_ptr<Communicator> bootstrap);
std::unique_ptr<Communicator> gpu_world(std::unique_ptr<Communicator> world, std::string* how = nullptr);

}  // namespace parallel
