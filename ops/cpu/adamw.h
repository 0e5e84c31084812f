// The optimizer phase on the CPU: AdamW's range kernel, the fused
// update that also writes the 16-bit compute copy and zeroes the gradient, the gradient-norm
// sum of squares of 16-bit tensors, and a threaded zero fill.
//
// Every threaded loop here splits its range into FIXED blocks (kOptBlock elements from the
// range's start, parallel_blocks), never into one chunk per thread, so that the result is the
// same bits on any thread count (tests/test_optim_fused.cpp, tests/test_ops_threads.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/backend.h"

namespace ops::cpu {

// Elements per block of the fused update and of the 16-bit sum of squares: the 2^14-element
// piece Backend's host defaults always used, so the fused kernels reproduce them bit for bit.
// A multiple of 16, so the AVX-512 / scalar split of every element is that of the old path.
constexpr int64_t kOptBlock = 1 << 14;

// AdamW (Loshchilov & Hutter 2019, Algorithm 2) on n contiguous fp32 elements, bias
// corrections passed in as 1/(1 - beta^t). The one copy of the arithmetic that adamw_update
// and the fused update both call, so that they agree bit for bit by construction.
void adamw_range(float* __restrict param, const float* __restrict grad, float* __restrict m, float* __restrict v,
                 int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float inv_bc1,
                 float inv_bc2, float grad_scale);

// sum x^2 accumulated in double (one block: the caller folds blocks in order).
double sum_squares_range(const float* __restrict x, int64_t n);

// Backend::adamw_update_typed (zero_grad false) and Backend::adamw_update_zero_grad (true) on
// the host (backend.h): one threaded pass over fixed blocks; in each block the moments, the
// master (or the parameter) and the 16-bit copy are written and, with zero_grad, the gradient
// block is zeroed while it is still in cache.
void adamw_update_fused(void* param, DType pt, void* grad, DType gt, float* master, float* m, float* v, int64_t n,
                        const Backend::AdamwArgs& a, bool zero_grad);

// Sum of squares in double of n 16-bit values (BF16, F16): blocks of kOptBlock widened and
// summed in parallel, the partials folded in block order. Equal to Backend's host default.
double sum_squares16(const void* x, DType t, int64_t n);

// p[0, bytes) := 0, over the OpenMP team for large buffers (a memset is bandwidth-bound, and
// one core does not reach the socket's write bandwidth).
void mem_zero(void* p, size_t bytes);

}  // namespace ops::cpu
