// What the CUDA backend holds besides tensors, in bytes: the plan of a GPU device kind adds it
// to the ledger's workspace (runner/plan/ledger.cpp), and the backend allocates exactly this
// (ops/cuda/cuda_backend.cu, counted in the Workspace account when it starts), so planned and
// measured workspace agree on the GPU as the dry run and the executor agree on tensors.
// A plain header with no CUDA in it: the plan prices a GPU on any machine.
#pragma once
#include <cstddef>

namespace ops::cuda {

// cuBLASLt's workspace (one, on the compute stream; 32 MiB is what NVIDIA recommends for Hopper).
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// sum_squares' double and the loss kernels' error flag.
constexpr size_t kScratchBytes = 64;
// A 16-bit Linear's bias widened to fp32 for cuBLASLt's bias epilogue: up to this many output
// features without growing (a larger bias grows it, counted as it grows).
constexpr size_t kWidenedBiasFloats = size_t{1} << 18;
// All of it, allocated when the backend starts.
constexpr size_t kFixedWorkspaceBytes = kGemmWorkspaceBytes + kScratchBytes + kWidenedBiasFloats * sizeof(float);

}  // namespace ops::cuda
