// Pointwise operators: GELU, SwiGLU, the residual add and dropout (ops/ops.h).
//
// Gelu     in: x (N,H).                out: (N,H).   saves x.
// SwiGLU   in: x (N,2H) = [gate | up]. out: (N,H).   saves x.
// Add      in: a, b (same shape).      out: a + b.   saves nothing (its backward adds dout to both).
// Dropout  in: x.                      out: x * keep / (1-p).  saves nothing: the mask is
//          regenerated from the counter RNG. Under sequence parallelism (seq_shard) x is this
//          rank's rows of the micro-batch, and its mask counters are offset by those rows.
#include "ops/ops.h"

namespace ops {
namespace {

std::vector<int> saves_input(const Node& n) { return {n.in[0]}; }

int64_t numel_in(const OpContext& c) { return numel_of(c.in_desc(0).shape); }

namespace gelu {

void forward(OpContext& c) {
  if (c.native16) return c.be.run(k::GeluForward(c.outs[0], c.ins[0], numel_in(c)), c.dtype16());
  c.be.run(k::GeluForward(c.out(0), c.in(0), numel_in(c)));
}
void backward(OpContext& c) {
  if (c.native16) return c.be.run(k::GeluBackward(c.dins[0], c.ins[0], c.dout, numel_in(c)), c.dtype16());
  c.be.run(k::GeluBackward(c.din(0), c.in(0), c.dout, numel_in(c)));
}

}  // namespace gelu

namespace swiglu {

void forward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  const int N = static_cast<int>(rows_of(x)), H = static_cast<int>(x.shape.back() / 2);
  if (c.native16) return c.be.run(k::SwigluForward(c.outs[0], c.ins[0], N, H), c.dtype16());
  c.be.run(k::SwigluForward(c.out(0), c.in(0), N, H));
}
void backward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  const int N = static_cast<int>(rows_of(x)), H = static_cast<int>(x.shape.back() / 2);
  if (c.native16) return c.be.run(k::SwigluBackward(c.dins[0], c.dout, c.ins[0], N, H), c.dtype16());
  c.be.run(k::SwigluBackward(c.din(0), c.dout, c.in(0), N, H));
}

}  // namespace swiglu

namespace add {

void forward(OpContext& c) {
  if (c.native16) return c.be.run(k::AddForward(c.outs[0], c.ins[0], c.ins[1], numel_in(c)), c.dtype16());
  c.be.run(k::AddForward(c.out(0), c.in(0), c.in(1), numel_in(c)));
}
void backward(OpContext& c) {
  if (c.native16) {
    c.be.run(k::AddInplace(c.dins[0], c.dout, numel_in(c)), c.dtype16());
    c.be.run(k::AddInplace(c.dins[1], c.dout, numel_in(c)), c.dtype16());
    return;
  }
  c.be.run(k::AddInplace(c.din(0), c.dout, numel_in(c)));
  c.be.run(k::AddInplace(c.din(1), c.dout, numel_in(c)));
}

}  // namespace add

namespace dropout {

// The mask of `numel` elements: the whole micro-batch's counters, or on a sequence shard
// those of this rank's rows.
DropoutSpec drop(const OpContext& c, int64_t numel) {
  const Graph& g = c.g;
  if (!c.n.seq_shard) return c.dropout(numel / g.B);
  DropoutSpec d = c.dropout(numel * g.sp_parts / g.B);
  d.offset += static_cast<uint64_t>(g.sp_index) * static_cast<uint64_t>(numel);
  return d;
}

void forward(OpContext& c) {
  const int64_t n = numel_in(c);
  if (c.native16) return c.be.run(k::DropoutForward(c.outs[0], c.ins[0], n, drop(c, n)), c.dtype16());
  c.be.run(k::DropoutForward(c.out(0), c.in(0), n, drop(c, n)));
}
void backward(OpContext& c) {
  const int64_t n = numel_in(c);
  if (c.native16) return c.be.run(k::DropoutBackward(c.dins[0], c.dout, n, drop(c, n)), c.dtype16());
  c.be.run(k::DropoutBackward(c.din(0), c.dout, n, drop(c, n)));
}

}  // namespace dropout

}  // namespace

constinit const OpDef kGeluOp{.kind = OpKind::Gelu, .name = "gelu", .saves = saves_input, .scratch = nullptr,
                              .forward = gelu::forward, .backward = gelu::backward, .native16 = true};
constinit const OpDef kSwiGLUOp{.kind = OpKind::SwiGLU, .name = "swiglu", .saves = saves_input, .scratch = nullptr,
                                .forward = swiglu::forward, .backward = swiglu::backward, .native16 = true};
constinit const OpDef kAddOp{.kind = OpKind::Add, .name = "add", .saves = saves_nothing, .scratch = nullptr,
                             .forward = add::forward, .backward = add::backward, .native16 = true};
constinit const OpDef kDropoutOp{.kind = OpKind::Dropout, .name = "dropout", .saves = saves_nothing,
                                 .scratch = nullptr, .forward = dropout::forward, .backward = dropout::backward,
                                 .native16 = true};

}  // namespace ops
