// Attention's operators: rotary position embedding and causal self-attention (ops/ops.h).
//
// Rope       in: qkv (B*T, 3C').  out: (B*T, 3C'), q and k rotated, v copied.
// Attention  in: qkv (B*T, 3C').  out: y (B*T, C'), probs (B, NH', T, T) saved for backward.
// C' = C/tp and NH' = NH/tp under tensor parallelism: a rank holds whole heads
// [head_start, head_start + NH'), so neither needs a collective; the attention's dropout
// counters are those of the logical head in the whole model, so a head shard draws the masks
// the unsharded model draws (DropoutSpec::heads_total).
#include "ops/ops.h"

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

std::vector<int> saves(const Node& n) { return {n.in[0], n.out[1]}; }  // qkv, probs

// Counters of the logical head in the whole model (ops/backend.h, DropoutSpec).
DropoutSpec drop(const OpContext& c) {
  const Node& n = c.n;
  const int total = n.heads_total > 0 ? n.heads_total : n.heads;
  DropoutSpec d = c.dropout(numel_of(c.out_desc(1).shape) / c.g.B / n.heads * total);
  d.heads_total = total;
  d.head_start = n.head_start;
  return d;
}

void forward(OpContext& c) {
  const int C = static_cast<int>(c.in_desc(0).shape.back() / 3);
  c.be.attention_forward(c.out(0), c.out(1), c.in(0), c.B(), c.T(), C, c.n.heads, drop(c));
}

void backward(OpContext& c) {
  const int C = static_cast<int>(c.in_desc(0).shape.back() / 3);
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
