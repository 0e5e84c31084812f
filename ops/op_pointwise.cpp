// Pointwise operators: GELU, squared ReLU, SwiGLU, the residual add and dropout (ops/ops.h).
//
// Gelu     in: x (N,H).                out: (N,H).   saves x.
// Relu2    in: x (N,H).                out: relu(x)^2 (N,H).  saves x.
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

// The activations (OPS_ACTIVATIONS, ops/kernels.h): one kernel each way.
template <class Fwd>
void activation_forward(OpContext& c) {
  if (c.native16) return c.be.run(Fwd{c.outs[0], c.ins[0], numel_in(c)}, c.dtype16());
  c.be.run(Fwd{c.out(0), c.in(0), numel_in(c)});
}
template <class Bwd>
void activation_backward(OpContext& c) {
  if (c.native16) return c.be.run(Bwd{c.dins[0], c.ins[0], c.dout, numel_in(c)}, c.dtype16());
  c.be.run(Bwd{c.din(0), c.in(0), c.dout, numel_in(c)});
}

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

// Figures (ops.h), per element of the output (n of them). FLOPs: a rough operation count, the
// backward about twice the forward where it recomputes the forward's intermediates and chains
// d(out) through them. Bytes: in units of the output's bytes, as the probes below move them
// (`runner calibrate` measures each kind's bandwidth on its probe): gelu reads x and writes y
// (2n) forward, reads x and d(y) and writes d(x) (3n) backward; swiglu's x is 2n: 3n forward,
// 5n backward; add: 3n each way; dropout and relu2 like gelu (dropout's mask is regenerated,
// not read).
namespace pointwise_figures {

constexpr double kGelu = 10.0;  // per element, the tanh approximation

double gelu_flops(const Graph& g, const Node& n, bool backward) {
  return (backward ? 2.0 * kGelu : kGelu) * numel_f(g, n.out[0]);
}
// Forward a compare and a multiply; backward a compare, the doubling, the product with d(out)
// and the accumulation.
double relu2_flops(const Graph& g, const Node& n, bool backward) {
  return (backward ? 4.0 : 2.0) * numel_f(g, n.out[0]);
}
double swiglu_flops(const Graph& g, const Node& n, bool backward) {
  return (backward ? 12.0 : 6.0) * numel_f(g, n.out[0]);
}
// Backward: d(out) added into both inputs' gradients.
double add_flops(const Graph& g, const Node& n, bool backward) {
  return backward ? 2.0 * numel_f(g, n.out[0]) : numel_f(g, n.out[0]);
}
// The regenerated mask and the scale, both ways.
double dropout_flops(const Graph& g, const Node& n, bool) { return 3.0 * numel_f(g, n.out[0]); }

// An activation: x read and y written forward; x and d(y) read, d(x) written backward. Each
// activation is calibrated on its own probe, under its own name (a fused node that contains
// one prices its part under that name too).
template <class Fwd>
OpTrafficParts activation_traffic(const Graph& g, const Node& n) {
  return traffic_of(Fwd::stem, nbytes_f(g, n.out[0]), 2, 3);
}
OpTrafficParts swiglu_traffic(const Graph& g, const Node& n) { return traffic_of("swiglu", nbytes_f(g, n.out[0]), 3, 5); }
OpTrafficParts add_traffic(const Graph& g, const Node& n) { return traffic_of("add", nbytes_f(g, n.out[0]), 3, 3); }
OpTrafficParts dropout_traffic(const Graph& g, const Node& n) { return traffic_of("dropout", nbytes_f(g, n.out[0]), 2, 3); }

void activation_probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, C});
  p.out("y", {N, C}, false);
}
void swiglu_probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, 2 * C});
  p.out("y", {N, C}, false);
}
void add_probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, C});
  p.param("b", {N, C});
  p.out("y", {N, C}, false);
}

}  // namespace pointwise_figures
}  // namespace

constinit const OpDef kSwiGLUOp{.kind = OpKind::SwiGLU, .name = "swiglu", .saves = saves_input, .scratch = nullptr,
                                .forward = swiglu::forward, .backward = swiglu::backward, .native16 = true,
                                .kernels = kernel_pair<Kernel::SwigluForward, Kernel::SwigluBackward>, .flops = pointwise_figures::swiglu_flops, .traffic = pointwise_figures::swiglu_traffic,
                                .probe = pointwise_figures::swiglu_probe};
constinit const OpDef kAddOp{.kind = OpKind::Add, .name = "add", .saves = saves_nothing, .scratch = nullptr,
                             .forward = add::forward, .backward = add::backward, .native16 = true,
                             .kernels = kernel_pair<Kernel::AddForward, Kernel::AddInplace>, .flops = pointwise_figures::add_flops, .traffic = pointwise_figures::add_traffic,
                             .probe = pointwise_figures::add_probe};
constinit const OpDef kDropoutOp{.kind = OpKind::Dropout, .name = "dropout", .saves = saves_nothing,
                                 .scratch = nullptr, .forward = dropout::forward, .backward = dropout::backward,
                                 .native16 = true, .kernels = kernel_pair<Kernel::DropoutForward, Kernel::DropoutBackward>, .flops = pointwise_figures::dropout_flops,
                                 .traffic = pointwise_figures::dropout_traffic};
// An activation's OpDef, named by its kernels' stem (the recipe's model.activation word): its
// kernels and its FLOPs are its own, the rest is common.
template <class Fwd, class Bwd>
constexpr OpDef activation_op(OpKind kind, double (*flops)(const Graph&, const Node&, bool)) {
  return OpDef{.kind = kind, .name = Fwd::stem, .saves = saves_input, .scratch = nullptr,
               .forward = activation_forward<Fwd>, .backward = activation_backward<Bwd>, .native16 = true,
               .kernels = kernel_pair<Fwd::id, Bwd::id>, .flops = flops,
               .traffic = pointwise_figures::activation_traffic<Fwd>, .probe = pointwise_figures::activation_probe};
}
constinit const OpDef kGeluOp = activation_op<k::GeluForward, k::GeluBackward>(OpKind::Gelu, pointwise_figures::gelu_flops);
constinit const OpDef kRelu2Op = activation_op<k::Relu2Forward, k::Relu2Backward>(OpKind::Relu2, pointwise_figures::relu2_flops);

}  // namespace ops
