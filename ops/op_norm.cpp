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

}  // namespace

constinit const OpDef kLayerNormOp{.kind = OpKind::LayerNorm, .name = "layernorm", .saves = layernorm::saves,
                                   .scratch = nullptr, .forward = layernorm::forward,
                                   .backward = layernorm::backward, .native16 = true,
                                   .native16_params = 0b110};
constinit const OpDef kRMSNormOp{.kind = OpKind::RMSNorm, .name = "rmsnorm", .saves = rmsnorm::saves,
                                 .scratch = nullptr, .forward = rmsnorm::forward, .backward = rmsnorm::backward,
                                 .native16 = true, .native16_params = 0b10};

}  // namespace ops
