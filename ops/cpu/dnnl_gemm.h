// 16-bit GEMM through oneDNN's matmul (bf16 operands, fp32 accumulation and output), the kernel
// behind Backend::matmul16_* on the CPU. Built only with RUNNER_HAVE_DNNL; without it every
// function reports "unavailable" and the callers (ops/gemm_path.h) keep the sgemm path.
//
// Creating a oneDNN primitive costs milliseconds (it generates code for the shape), so each
// (dtype, layout, shape, bias, accumulate) primitive is created once per process and kept.
#pragma once
#include <string>

#include "ops/tensor.h"

namespace ops::cpu {

// True when this build has oneDNN and it runs a 16-bit (t: BF16 or F16) matmul on this CPU with
// a real kernel (a reference implementation, hundreds of times slower, counts as unavailable).
bool dnnl_gemm_available(DType t);
// Why not, or the implementation oneDNN picked (e.g. "brg:avx512_core_amx" or
// "brg:avx512_core_bf16"), for the start-up line.
std::string dnnl_gemm_info(DType t);

// C (M,N) = op(A) (M,K) @ op(B) (K,N) [+ bias (N), fp32] [+ C when accumulate], row-major with
// leading dimensions lda, ldb, ldc. A and B hold t (BF16 or F16); op(X) = X^T when trans_X, i.e.
// A is stored (K,M) and B (N,K). Products are accumulated in fp32, C is fp32. Throws
// std::logic_error when unavailable (callers check dnnl_gemm_available first).
void dnnl_gemm(DType t, bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B,
               int ldb, const float* bias, bool accumulate, float* C, int ldc);

}  // namespace ops::cpu
