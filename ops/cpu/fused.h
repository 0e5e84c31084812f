// The CPU kernels of fused operators (ops/op_fused.cpp): the passes that replace
// two or more of the unfused operators' passes over an activation. The GEMMs stay OpenBLAS's,
// called by the backend (cpu_backend.cpp) exactly as the unfused Linear calls them, so that a
// fused node's results are bit-identical to the unfused nodes'.
#pragma once
#include <cstdint>

namespace ops::cpu {

// LinearGelu's backward pass over pre (N,OC): dpre (N,OC) holds d(out) on entry and
// d(pre) = d(out) * gelu'(pre) on return; dbias (OC) += the column sums of d(pre) (null: none).
// One pass instead of GELU's backward pass plus the Linear's bias-gradient pass. Threads own
// columns and each column's sum runs over the rows in order, so the bits depend neither on the
// thread count nor on the split, and equal the unfused sum's (the Linear's bias pass sums so).
void gelu_backward_bias(float* dpre, float* dbias, const float* pre, int64_t N, int64_t OC);

}  // namespace ops::cpu
