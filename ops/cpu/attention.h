// Causal self-attention on the CPU, multi-head and grouped-query (see ops/backend.h for the contract).
#pragma once
#include "ops/backend.h"

namespace ops::cpu {

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads heads, DropoutSpec drop);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                        Heads heads, DropoutSpec drop, float* work);
// The same on 16-bit storage (t: BF16 or F16): qkv, out, dout and dqkv in t,
// widened while packing each (b, h)'s panels; bit-identical to the widened path (ops/backend.h).
void attention_forward16(void* out, float* lse, const void* qkv, DType t, int B, int T, int C, Heads heads,
                         DropoutSpec drop);
void attention_backward16(void* dqkv, const void* dout, const void* qkv, const float* lse, DType t, int B, int T,
                          int C, Heads heads, DropoutSpec drop, float* work);

// The KV cache (ops/backend.h, KvView): prefill's store of K and V, and one decode step's
// attention of each row's new query over its cached positions (q, k already roped).
void kv_cache_write(KvView kv, const float* qkv, int B, int T, int C, Heads heads);
void attention_decode(float* out, const float* qkv, KvView kv, const int32_t* pos, int B, int C, Heads heads);

// Rows per block of the blocked causal product (tuned with bench/bench_kernels).
int attention_block_rows();
void set_attention_block_rows(int rows);

}  // namespace ops::cpu
