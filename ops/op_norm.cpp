// Normalisations over the last dimension: LayerNorm and RMSNorm (ops/ops.h).
//
// LayerNorm  in: x (N,C), weight (C), bias (C) optional.  out: y (N,C), mean (N), rstd (N).
// RMSNorm    in: x (N,C), weight (C).                     out: y (N,C), rstd (N).
// The per-row statistics are outputs so that the backward reads them instead of recomputing
// them. Under sequence parallelism N is this rank's rows and the weight gradients are partial
// sums over them (TensorDesc::seq_partial: the caller sums them over tp); no collective here.
#include "ops/ops.h"

namespace ops {
namespace {

namespace layernorm {

std::vector<int> saves(const Node& n) { return {n.in[0], n.in[1], n.out[1], n.out[2]}; }  // x, w, mean, rstd

void forward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  if (c.native16)
    return c.be.run(k::LayerNormForward(c.outs[0], c.out(1), c.out(2), c.ins[0], c.in(1), c.in(2),
                                    static_cast<int>(rows_of(x)), static_cast<int>(x.shape.back()), c.n.eps), c.dtype16());
  c.be.run(k::LayerNormForward(c.out(0), c.out(1), c.out(2), c.in(0), c.in(1), c.in(2), static_cast<int>(rows_of(x)),
                         static_cast<int>(x.shape.back()), c.n.eps));
}

void backward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  if (c.native16)
    return c.be.run(k::LayerNormBackward(c.dins[0], c.din(1), c.din(2), c.dout, c.ins[0], c.in(1), c.out(1), c.out(2), static_cast<int>(rows_of(x)), static_cast<int>(x.shape.back())), c.dtype16());
  c.be.run(k::LayerNormBackward(c.din(0), c.din(1), c.din(2), c.dout, c.in(0), c.in(1), c.out(1), c.out(2),
                          static_cast<int>(rows_of(x)), static_cast<int>(x.shape.back())));
}

}  // namespace layernorm

namespace rmsnorm {

std::vector<int> saves(const Node& n) { return {n.in[0], n.in[1], n.out[1]}; }  // x, w, rstd

void forward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  if (c.native16)
    return c.be.run(k::RmsNormForward(c.outs[0], c.out(1), c.ins[0], c.in(1), static_cast<int>(rows_of(x)),
                                  static_cast<int>(x.shape.back()), c.n.eps), c.dtype16());
  c.be.run(k::RmsNormForward(c.out(0), c.out(1), c.in(0), c.in(1), static_cast<int>(rows_of(x)),
                       static_cast<int>(x.shape.back()), c.n.eps));
}

void backward(OpContext& c) {
  const TensorDesc& x = c.in_desc(0);
  if (c.native16)
    return c.be.run(k::RmsNormBackward(c.dins[0], c.din(1), c.dout, c.ins[0], c.in(1), c.out(1),
                                   static_cast<int>(rows_of(x)), static_cast<int>(x.shape.back())), c.dtype16());
  c.be.run(k::RmsNormBackward(c.din(0), c.din(1), c.dout, c.in(0), c.in(1), c.out(1), static_cast<int>(rows_of(x)),
                        static_cast<int>(x.shape.back())));
}

}  // namespace rmsnorm

// Figures (ops.h), per element of y (n of them). FLOPs, a rough count: LayerNorm's mean,
// variance, normalise, scale and shift (8); RMSNorm's square, mean, rsqrt, normalise and scale
// (5); the backward about twice (the row reductions of d(y), the weight gradients). Bytes: the
// forward reads x and writes y (2n), the backward reads x and d(y) and writes d(x) (3n); the
// weights and per-row statistics are small beside them.
namespace norm_figures {

double layernorm_flops(const Graph& g, const Node& n, bool backward) {
  return (backward ? 16.0 : 8.0) * numel_f(g, n.out[0]);
}
double rmsnorm_flops(const Graph& g, const Node& n, bool backward) {
  return (backward ? 10.0 : 5.0) * numel_f(g, n.out[0]);
}
OpTrafficParts layernorm_traffic(const Graph& g, const Node& n) {
  return traffic_of("layernorm", nbytes_f(g, n.out[0]), 2, 3);
}
OpTrafficParts rmsnorm_traffic(const Graph& g, const Node& n) { return traffic_of("rmsnorm", nbytes_f(g, n.out[0]), 2, 3); }

void layernorm_probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, C});
  p.param("w", {C});
  p.param("b", {C});
  p.out("y", {N, C}, false);
  p.out("mean", {N}, true);
  p.out("rstd", {N}, true);
  p.node().eps = 1e-5f;
}
void rmsnorm_probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, C});
  p.param("w", {C});
  p.out("y", {N, C}, false);
  p.out("rstd", {N}, true);
  p.node().eps = 1e-6f;
}

}  // namespace norm_figures
}  // namespace

constinit const OpDef kLayerNormOp{.kind = OpKind::LayerNorm, .name = "layernorm", .saves = layernorm::saves,
                                   .scratch = nullptr, .forward = layernorm::forward,
                                   .backward = layernorm::backward, .native16 = true,
                                   .native16_params = 0b110, .kernels = kernel_pair<Kernel::LayerNormForward, Kernel::LayerNormBackward>, .flops = norm_figures::layernorm_flops,
                                   .traffic = norm_figures::layernorm_traffic, .probe = norm_figures::layernorm_probe};
constinit const OpDef kRMSNormOp{.kind = OpKind::RMSNorm, .name = "rmsnorm", .saves = rmsnorm::saves,
                                 .scratch = nullptr, .forward = rmsnorm::forward, .backward = rmsnorm::backward,
                                 .native16 = true, .native16_params = 0b10, .kernels = kernel_pair<Kernel::RmsNormForward, Kernel::RmsNormBackward>, .flops = norm_figures::rmsnorm_flops,
                                 .traffic = norm_figures::rmsnorm_traffic, .probe = norm_figures::rmsnorm_probe};

}  // namespace ops
