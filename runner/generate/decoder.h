// Cached decoding: the KV cache of a generation request and the two graphs that use it.
//
// The cache is allocated once per request, from the plan's `inference:` section (rows =
// inference.batch, context = inference.context or seq_len, format = inference.kv_dtype), in
// the kv_cache account, so the tracker's bytes are the plan's KV-cache figure (tested). A
// recipe without an inference section gets a cache of the request's batch over seq_len in
// fp32. A request over the plan's largest batch, the cache's rows or its context is refused
// (UserError, with the numbers) before anything is allocated.
//
// Prefill runs the prompts as one batch through the model builder's graph for (batch, longest
// prompt): the training graph and kernels, whose Attention nodes also store each layer's K and
// V. Decode runs the builder's decode graph (GptSpec::decode: one token per row, the same
// embedding, norms, linears, MLP and head) whose attention reads the cache at each row's own
// position (ops/backend.h, attention_decode). Nothing here is a second model.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/executor.h"
#include "ops/kv_cache.h"
#include "runner/trained/trained_model.h"

namespace runner {

struct KvCacheShape {
  int64_t rows = 0, context = 0;
  ops::DType dtype = ops::DType::F32;
  bool from_plan = false;  // the plan's inference section (else: the request's batch, seq_len, fp32)
};
// The cache a request of `batch` sequences gets.
KvCacheShape kv_cache_shape(const TrainedModel& m, int64_t batch);

class CachedDecoder {
 public:
  // `batch` sequences, none longer than `longest` tokens (prompt + new tokens). Throws
  // UserError before allocating when they do not fit the plan's inference sizing.
  CachedDecoder(TrainedModel& m, int64_t batch, int64_t longest);
  ~CachedDecoder();
  CachedDecoder(const CachedDecoder&) = delete;
  CachedDecoder& operator=(const CachedDecoder&) = delete;

  // B rows of T tokens (row-major, B*T): fills positions [0, T) of every row's cache and
  // returns the logits (B*T, padded vocabulary), valid until the next call.
  const ops::Tensor& prefill(const std::vector<int32_t>& tokens, int64_t T);
  // One token per row, row b's at position pos[b] (its cache holds [0, pos[b]) already):
  // returns the logits (B, padded vocabulary), valid until the next call.
  const ops::Tensor& step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos);

  const ops::KvCache& cache() const { return *cache_; }
  int64_t batch() const { return B_; }

 private:
  TrainedModel& m_;
  int64_t B_;
  std::unique_ptr<ops::KvCache> cache_;
  std::unique_ptr<ops::Graph> prefill_g_, decode_g_;
  std::unique_ptr<ops::Executor> prefill_ex_, decode_ex_;
};

}  // namespace runner
