// The inference KV cache: per transformer layer, the keys and values of every sequence of a
// generation batch at every position of the context, allocated once (account kv_cache) and
// written by the attention as it runs.
//
// Prefill runs the prompts through the model's ordinary graph; each Attention node, seeing a
// cache on the executor, also stores the (roped) K and V it attended with. Decode runs the
// same model's graph built for one position per row (Graph::decode): its Attention nodes call
// Backend::attention_decode, which stores the new position's K and V and attends over the
// cache. Formats: fp32, bf16, fp16, int8 with an fp32 scale per (row, position, head)
// (ops/backend.h, KvView). Only the key-value heads are stored (grouped-query attention:
// n_kv_heads of them, shared by the query heads). bytes() is what the tracker counts; the plan's KV-cache figure
// (runner/plan/ledger.cpp) is the same sum and a test holds them equal.
//
// The cache lives on the run's device (ops::tensor_device(): the strict device, a GPU), as
// every tensor does; the decode positions are kept twice: on the host, where the embedding
// picks its position rows, and in device memory, where attention_decode reads them
// (set_positions writes both: one crossing in per step).
#pragma once
#include <cstdint>
#include <vector>

#include "ops/backend.h"
#include "ops/tensor.h"

namespace ops {

class KvCache {
 public:
  // Layers [first_layer, first_layer + layers) of rows x context positions x Ckv channels over
  // NKV key-value heads (this rank's: with grouped-query attention fewer than the query heads,
  // which is what makes its cache smaller), in dtype F32, BF16, F16 or I8.
  KvCache(int first_layer, int layers, int64_t rows, int64_t context, int64_t Ckv, int64_t NKV, DType dtype);

  // Bytes this configuration allocates: 2 * layers * rows * context * (Ckv * size(dtype)
  // + (I8 ? NKV * 4 : 0)).
  static size_t bytes_for(int layers, int64_t rows, int64_t context, int64_t Ckv, int64_t NKV, DType dtype);
  size_t bytes() const;

  bool has_layer(int layer) const { return layer >= first_ && layer < first_ + static_cast<int>(k_.size()); }
  KvView layer(int layer);
  int64_t rows() const { return rows_; }
  int64_t context() const { return context_; }
  DType dtype() const { return dtype_; }

  // Decode: the position each row's new token takes (rows of the decode graph), set before
  // every step: `pos` on the host and its copy in device memory (queued after the kernels
  // before it, so a step's positions never change under the previous step's attention). The
  // first positions.size() rows take them (a request may use fewer rows than the cache has).
  void set_positions(const std::vector<int32_t>& positions);
  std::vector<int32_t> pos;  // read-only outside set_positions (the device copy follows it)
  // The positions in device memory: attention_decode's `pos` argument.
  const int32_t* device_positions() const { return pos_dev_.data<int32_t>(); }

 private:
  int first_;
  int64_t rows_, context_, C_, NH_;
  DType dtype_;
  std::vector<Tensor> k_, v_, ks_, vs_;
  Tensor pos_dev_;  // (rows,) int32, account workspace: not part of the plan's KV-cache figure
};

}  // namespace ops
