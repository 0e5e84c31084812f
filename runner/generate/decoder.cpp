#include "runner/generate/decoder.h"

#include <fmt/format.h>

#include "ops/backend.h"
#include "runner/errors.h"
#include "runner/model/gpt.h"

namespace runner {

KvCacheShape kv_cache_shape(const TrainedModel& m, int64_t batch) {
  KvCacheShape s;
  const Recipe& r = m.plan.recipe;
  if (r.inference && m.plan.inference) {
    s.rows = m.plan.inference->batch;
    s.context = m.plan.inference->context;
    s.dtype = kv_cache_dtype(r.inference->kv_dtype);
    s.from_plan = true;
  } else {
    s.rows = batch;
    s.context = m.model().seq_len;
  }
  return s;
}

namespace {
// The graph of `spec` in `g` and an executor on it in `ex` (an earlier one goes first: it
// refers to the graph it replaces), bound to the model's weights and reading and writing `cache`.
void build_cached(TrainedModel& m, const GptSpec& spec, ops::KvCache* cache, std::unique_ptr<ops::Graph>& g,
                  std::unique_ptr<ops::Executor>& ex) {
  ex.reset();
  g = std::make_unique<ops::Graph>(build_gpt_graph(spec));
  ex = std::make_unique<ops::Executor>(*g, *m.backend);
  m.bind(*ex, *g);
  ex->set_kv_cache(cache);
}
}  // namespace

CachedDecoder::CachedDecoder(TrainedModel& m, int64_t batch, int64_t longest) : m_(m), B_(batch) {
  const ModelConfig& mc = m.model();
  const KvCacheShape s = kv_cache_shape(m, batch);
  if (s.from_plan) {
    const InferencePlan& ip = *m.plan.inference;
    if (batch > ip.max_batch)
      throw UserError({m.checkpoint, 0, 0},
                      fmt::format("{} prompts are more than the plan's largest inference batch, {} (KV cache {} per "
                                  "sequence beside {} of weights)", batch, ip.max_batch,
                                  format_bytes(ip.kv_per_sequence), format_bytes(ip.weights)),
                      "pass fewer prompts per call");
    if (batch > s.rows)
      throw UserError({m.checkpoint, 0, 0},
                      fmt::format("{} prompts are more than the KV cache's {} sequences (inference.batch {}, {} "
                                  "per sequence)", batch, s.rows, s.rows, format_bytes(ip.kv_per_sequence)),
                      fmt::format("pass at most {} prompts, or --set inference.batch={} (the plan fits up to {})",
                                  s.rows, batch, ip.max_batch));
    if (longest > s.context)
      throw UserError({m.checkpoint, 0, 0},
                      fmt::format("a prompt plus --max-new-tokens is {} tokens, over the KV cache's context of {} "
                                  "(inference.context)", longest, s.context),
                      fmt::format("shorten the prompt or --max-new-tokens, or --set inference.context={} (at most "
                                  "seq_len {})", longest, mc.seq_len));
  }
  if (s.context > mc.seq_len && mc.position == Position::learned)
    throw UserError({m.checkpoint, 0, 0},
                    fmt::format("inference.context {} is over seq_len {}: learned positions stop there", s.context, mc.seq_len),
                    fmt::format("--set inference.context={} or less", mc.seq_len));
  // The key-value heads only (grouped-query attention: n_kv_heads of them), and under tp this
  // rank's: n_kv_heads / tp, or all of them when replicated (the plan's figure is per rank).
  const int64_t nkv = rank_kv_heads(mc, m.plan.tp);
  // Under pp this stage's layers only.
  GptSpec spec = m.spec();
  const int64_t last = spec.last_layer < 0 ? mc.n_layers : spec.last_layer;
  cache_ = std::make_unique<ops::KvCache>(static_cast<int>(spec.first_layer), static_cast<int>(last - spec.first_layer), s.rows,
                                          s.context, nkv * (mc.d_model / mc.n_heads), nkv, s.dtype);
  spec.B = B_;
  spec.decode = true;
  build_cached(m, spec, cache_.get(), decode_g_, decode_ex_);
}

CachedDecoder::~CachedDecoder() = default;

const ops::Tensor& CachedDecoder::prefill(const std::vector<int32_t>& tokens, int64_t T) {
  RUNNER_CHECK(static_cast<int64_t>(tokens.size()) == B_ * T, "prefill: tokens are not B x T");
  RUNNER_CHECK(T >= 1 && T <= cache_->context(), "prefill: more positions than the KV cache's context");
  GptSpec spec = m_.spec();
  spec.B = B_;
  spec.T = T;
  build_cached(m_, spec, cache_.get(), prefill_g_, prefill_ex_);
  return m_.logits(*prefill_ex_, *prefill_g_, tokens.data());
}

const ops::Tensor& CachedDecoder::step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos) {
  RUNNER_CHECK(static_cast<int64_t>(tokens.size()) == B_ && static_cast<int64_t>(pos.size()) == B_,
               "decode step: one token and one position per row");
  for (int64_t b = 0; b < B_; ++b)
    RUNNER_CHECK(pos[static_cast<size_t>(b)] >= 0 && pos[static_cast<size_t>(b)] < cache_->context(),
                 "decode step: a position outside the KV cache's context");
  cache_->set_positions(pos);  // one crossing in: the embedding and the attention read them
  return m_.logits(*decode_ex_, *decode_g_, tokens.data());
}

}  // namespace runner
