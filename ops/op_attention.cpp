// Attention's operators: rotary position embedding and causal self-attention (ops/ops.h).
//
// Rope       in: qkv (B*T, 3C').  out: (B*T, 3C'), q and k rotated, v copied.
// Attention  in: qkv (B*T, 3C').  out: y (B*T, C'), probs (B, NH', T, T) saved for backward.
// C' = C/tp and NH' = NH/tp under tensor parallelism: a rank holds whole heads
// [head_start, head_start + NH'), so neither needs a collective; the attention's dropout
// counters are those of the logical head in the whole model, so a head shard draws the masks
// the unsharded model draws (DropoutSpec::heads_total).
#include "ops/ops.h"

#include <stdexcept>
#include <string>

namespace ops {
namespace {

namespace rope {

void forward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  c.be.rope_forward(c.out(0), c.in(0), c.B(), c.T(), static_cast<int>(x.shape.back() / 3), c.n.heads, c.n.theta);
}

void backward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  c.be.rope_backward(c.din(0), c.dout, c.B(), c.T(), static_cast<int>(x.shape.back() / 3), c.n.heads, c.n.theta);
}

}  // namespace rope

namespace attention {

// qkv, probs (a decode graph's attention has no probs and no backward)
std::vector<int> saves(const Node& n) {
  if (n.out.size() < 2) return {n.in[0]};
  return {n.in[0], n.out[1]};
}

// Counters of the logical head in the whole model (ops/backend.h, DropoutSpec).
DropoutSpec drop(const OpContext& c) {
  const Node& n = c.n;
  const int total = n.heads_total > 0 ? n.heads_total : n.heads;
  DropoutSpec d = c.dropout(numel_of(c.out_desc(1).shape) / c.g.B / n.heads * total);
  d.heads_total = total;
  d.head_start = n.head_start;
  return d;
}

// With a KV cache (generation): a prefill graph attends as in training and stores this
// layer's K and V; a decode graph attends one position per row over the cache (rope, when the
// model has it, applied there at each row's position: the decode graph has no Rope node).
void forward(OpContext& c) {
  const int C = static_cast<int>(c.in_desc(0).shape.back() / 3);
  if (c.g.decode) {
    if (!c.kv || !c.kv->has_layer(c.n.layer))
      throw std::logic_error("node " + c.n.name + ": a decode graph needs the executor's KV cache (set_kv_cache)");
    if (static_cast<int64_t>(c.kv->pos.size()) < c.B()) throw std::logic_error("KV cache: fewer positions than rows");
    c.be.attention_decode(c.out(0), c.in(0), c.kv->layer(c.n.layer), c.kv->pos.data(), c.B(), C, c.n.heads,
                          c.n.rope ? c.n.theta : 0.0f);
    return;
  }
  c.be.attention_forward(c.out(0), c.out(1), c.in(0), c.B(), c.T(), C, c.n.heads, drop(c));
  if (c.kv) c.be.kv_cache_write(c.kv->layer(c.n.layer), c.in(0), c.B(), c.T(), C, c.n.heads);
}

void backward(OpContext& c) {
  const int C = static_cast<int>(c.in_desc(0).shape.back() / 3);
  if (c.g.decode) throw std::logic_error("node " + c.n.name + ": a decode graph has no backward");
  c.be.attention_backward(c.din(0), c.dout, c.in(0), c.out(1), c.B(), c.T(), C, c.n.heads, drop(c));
}

}  // namespace attention

}  // namespace

constinit const OpDef kRopeOp{.kind = OpKind::Rope, .name = "rope", .saves = saves_nothing, .scratch = nullptr,
                              .forward = rope::forward, .backward = rope::backward};
constinit const OpDef kAttentionOp{.kind = OpKind::Attention, .name = "attention", .saves = attention::saves,
                                   .scratch = nullptr, .forward = attention::forward,
                                   .backward = attention::backward};

}  // namespace ops
