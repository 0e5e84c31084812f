// 16-bit-native memory-bound kernels over host memory (docs/precision.md,
// "16-bit-native kernels").
//
// Each function does what the executor's widened path does for one operator (widen the
// 16-bit activations to fp32, run the fp32 kernel, round the outputs back), but one tile at a
// time: a tile of rows or elements is widened into a small thread-local fp32 buffer, `be`'s own
// fp32 kernel runs on the tile (inline: the tiles are shared out over the OpenMP team, and a
// kernel called inside a parallel region does not fork again), and the tile's results are
// rounded into the 16-bit tensor. The arithmetic is the fp32 kernel's, so the results are
// bit-identical to the widened path, without its whole-tensor fp32 copies. Activation
// gradients are folded as Backend::accumulate folds them: d := RNE(d + g), g accumulated by
// the kernel into a zeroed tile. Reductions over rows (a norm's dweight, dbias) use the fp32
// kernel's fixed row blocks (norm_reduce_block_rows) and fold the per-block partials in block
// order, as that kernel does.
//
// The tile buffers are thread-local and outside the memory accounts: a few tiles of 32 KiB,
// a norm block (>= 64 rows), and for RoPE one whole sequence (T x (NH + 2 NKV) HS floats per
// buffer: the fp32 kernel's angle is a row's position in the call, so a tile cannot start
// mid-sequence). A RoPE kernel with a position offset would shrink the last one.
//
// The signatures are Backend's *16 entry points (ops/backend.h) with the fp32 backend first.
#pragma once
#include <cstdint>

#include "ops/backend.h"

namespace ops::native16 {

void embedding_forward(Backend& be, void* out, DType t, const int32_t* tokens, const void* wte, const void* wpe,
                       int B, int T, int C);
void embedding_backward(Backend& be, float* dwte, float* dwpe, const void* dout, DType t, const int32_t* tokens,
                        int B, int T, int C);
void layernorm_forward(Backend& be, void* out, float* mean, float* rstd, const void* inp, const float* weight,
                       const float* bias, DType t, int N, int C, float eps);
void layernorm_backward(Backend& be, void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const float* weight, const float* mean, const float* rstd, DType t, int N, int C);
void rmsnorm_forward(Backend& be, void* out, float* rstd, const void* inp, const float* weight, DType t, int N,
                     int C, float eps);
void rmsnorm_backward(Backend& be, void* dinp, float* dweight, const void* dout, const void* inp,
                      const float* weight, const float* rstd, DType t, int N, int C);
void rope_forward(Backend& be, void* out, const void* inp, DType t, int B, int T, int C, Heads heads, float theta);
void rope_backward(Backend& be, void* dinp, const void* dout, DType t, int B, int T, int C, Heads heads,
                   float theta);
// The activations (OPS_ACTIVATIONS, ops/kernels.h): stem_forward and stem_backward each.
#define OPS_NATIVE16_ACTIVATION(A, a)                                                   \
  void a##_forward(Backend& be, void* out, const void* inp, DType t, int64_t n);        \
  void a##_backward(Backend& be, void* dinp, const void* inp, const void* dout, DType t, int64_t n);
OPS_ACTIVATIONS(OPS_NATIVE16_ACTIVATION)
#undef OPS_NATIVE16_ACTIVATION
void swiglu_forward(Backend& be, void* out, const void* inp, DType t, int N, int H);
void swiglu_backward(Backend& be, void* dinp, const void* dout, const void* inp, DType t, int N, int H);
void add_forward(Backend& be, void* out, const void* a, const void* b, DType t, int64_t n);
void add_inplace(Backend& be, void* dst, const void* src, DType t, int64_t n);
void dropout_forward(Backend& be, void* out, const void* inp, DType t, int64_t n, DropoutSpec drop);
void dropout_backward(Backend& be, void* dinp, const void* dout, DType t, int64_t n, DropoutSpec drop);
// AddNorm (the AddLayerNorm and AddRmsNorm kernels, 16-bit t).
void add_layernorm_forward(Backend& be, void* sum, void* out, float* mean, float* rstd, const void* a, const void* b,
                           const float* weight, const float* bias, DType t, int N, int C, float eps);
void add_layernorm_backward(Backend& be, void* da, void* db, float* dweight, float* dbias, void* dsum,
                            const void* dout, const void* sum, const float* weight, const float* mean,
                            const float* rstd, DType t, int N, int C);
void add_rmsnorm_forward(Backend& be, void* sum, void* out, float* rstd, const void* a, const void* b,
                         const float* weight, DType t, int N, int C, float eps);
void add_rmsnorm_backward(Backend& be, void* da, void* db, float* dweight, void* dsum, const void* dout,
                          const void* sum, const float* weight, const float* rstd, DType t, int N, int C);

}  // namespace ops::native16

namespace ops::cpu {
// Rows per block of the CPU norms' weight-gradient reductions (cpu_backend.cpp's
// reduce_block_rows): native16's norm backwards cut the same blocks.
int64_t norm_reduce_block_rows(int64_t C);
}  // namespace ops::cpu
