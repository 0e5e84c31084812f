// Fused operators (issue 29, "fusion where the graph allows it"; ops/ops.h).
//
// LinearGelu: the MLP's fc Linear and its GELU in one node.
//   in: x (N,IC), W (OC,IC), b (OC) optional.
//   out: h (N,OC) = gelu(pre), pre (N,OC) = x W^T + b (the pre-activation the backward reads).
//   saves x, W and pre: what the unfused Linear (x, W) and Gelu (pre) save, no more.
// Forward: the Linear's GEMM (bias first, as the Linear adds it) then the GELU pass. Backward:
// one pass turns d(h) into d(pre) in place (OpDef::consumes_dout: d(h) is dead after this node)
// and sums the bias gradient, then the GEMMs for d(x) and d(W). The unfused pair needs a
// zeroed (N,OC) buffer for d(pre), a GELU pass and a bias pass; the fused node allocates no
// scratch at all, so its dry run has nothing to count and its backward holds one (N,OC)
// gradient fewer than the unfused pair's. Results are bit-identical to the unfused pair's
// (tests/test_ops_fused.cpp).
//
// The model builder emits it only for fp32 activations outside sequence parallelism
// (runner/model/gpt.cpp, recipe key model.fuse): a 16-bit pre would be rounded before the
// unfused GELU reads it, and the 16-bit GEMMs and sequence parallelism's collectives live in
// the unfused Linear. Column tensor parallelism is supported (d(x) all-reduced, Megatron's f).
#include <stdexcept>

#include "ops/ops.h"

namespace ops {
namespace {
namespace linear_gelu {

std::vector<int> saves(const Node& n) { return {n.in[0], n.in[1], n.out[1]}; }  // x, W, pre

// What the fused node does not do (the builder keeps these unfused): sequence parallelism's
// gathers, the row-parallel all-reduce, and 16-bit tensors (a 16-bit pre would be rounded
// before the unfused GELU reads it, so fusing would change the numbers).
void refuse_unfusable(const OpContext& c) {
  const Node& n = c.n;
  if (n.gather_input || n.scatter_output || n.tp == TpMode::Row)
    throw std::logic_error("node " + n.name + " (linear_gelu): only a plain or column-parallel Linear fuses with "
                           "its GELU; the builder keeps sequence-parallel and row-parallel ones unfused");
  for (const std::vector<int>* ids : {&n.in, &n.out})
    for (int id : *ids)
      if (c.g.tensors[id].dtype != DType::F32)
        throw std::logic_error("node " + n.name + " (linear_gelu): fp32 only; the builder keeps 16-bit fc + gelu unfused");
}

void forward(OpContext& c) {
  refuse_unfusable(c);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  c.be.linear_gelu_forward(c.out(0), c.out(1), c.in(0), c.in(1), c.in(2), static_cast<int>(rows_of(c.in_desc(0))),
                           IC, OC);
}

void backward(OpContext& c) {
  refuse_unfusable(c);
  if (!c.dout_own) throw std::logic_error("node " + c.n.name + ": linear_gelu's backward needs its d(out) buffer");
  const TensorDesc& x = c.in_desc(0);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  float* dx = c.din(0);
  c.be.linear_gelu_backward(dx, c.din(1), c.din(2), c.dout_own, c.out(1), c.in(0), c.in(1),
                            static_cast<int>(rows_of(x)), IC, OC);
  // Column-parallel: each rank holds part of d(input) (as the unfused Linear).
  if (c.n.tp == TpMode::Column && dx) c.allreduce(dx, numel_of(x.shape));
}

}  // namespace linear_gelu
}  // namespace

constinit const OpDef kLinearGeluOp{.kind = OpKind::LinearGelu, .name = "linear_gelu", .saves = linear_gelu::saves,
                                    .scratch = nullptr, .forward = linear_gelu::forward,
                                    .backward = linear_gelu::backward, .consumes_dout = true};

}  // namespace ops
