// Fused operators (one pass over memory where the graph allows it; ops/ops.h).
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
//
// AddLayerNorm, AddRMSNorm: a residual Add and the norm that reads its sum, in one node.
//   in: a (N,C), b (N,C), weight (C), bias (C) (LayerNorm, optional).
//   out: sum (N,C) = a + b (the residual stream: the next residual add reads it), y (N,C) = the
//   norm of sum, then the norm's statistics: mean (N), rstd (N) (LayerNorm) or rstd (N).
//   saves sum, weight and the statistics: what the unfused norm saves (the Add saves nothing).
// Forward: one pass over rows adds a and b, stores the sum (rounded to its dtype) and norms
// the stored sum, as the unfused norm reads it. Backward: both outputs have readers, so the
// node reads both gradients (OpDef::reads_dout1): the norm's backward adds into d(sum) in place
// (OpDef::consumes_dout: d(sum) is dead after this node; unfused, the norm accumulates into the
// same buffer) and the total is added into d(a) and d(b), in one pass over rows. Bit-identical
// to the unfused Add + norm in fp32 and, on the 16-bit-native path, in bf16 and fp16
// (tests/test_ops_fused.cpp).
//
// The builder (runner/model/gpt.cpp) emits it for the block's first residual add and the
// second norm, without tensor or sequence parallelism, with fp32 activations or 16-bit ones on
// the native path (a 16-bit sum widened by the executor would reach the kernel unrounded), and
// only where the layer's recompute set treats the residual and norm modules alike.
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
  c.be.run(k::LinearGeluForward(c.out(0), c.out(1), c.in(0), c.in(1), c.in(2), static_cast<int>(rows_of(c.in_desc(0))),
                           IC, OC));
}

void backward(OpContext& c) {
  refuse_unfusable(c);
  if (!c.dout_own) throw std::logic_error("node " + c.n.name + ": linear_gelu's backward needs its d(out) buffer");
  const TensorDesc& x = c.in_desc(0);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  float* dx = c.din(0);
  c.be.run(k::LinearGeluBackward(dx, c.din(1), c.din(2), c.dout_own, c.out(1), c.in(0), c.in(1),
                            static_cast<int>(rows_of(x)), IC, OC));
  // Column-parallel: each rank holds part of d(input) (as the unfused Linear).
  if (c.n.tp == TpMode::Column && dx) c.allreduce(dx, numel_of(x.shape));
}

}  // namespace linear_gelu

namespace add_norm {

// What the fused node does not do: tensor parallelism (none of its tensors is sharded; the
// builder keeps tp and sp graphs unfused) and the widened 16-bit path, where the executor
// would hand the kernel fp32 copies and the sum would be normed before its rounding.
void refuse_unfusable(const OpContext& c) {
  const Node& n = c.n;
  if (n.tp != TpMode::None || n.gather_input || n.scatter_output)
    throw std::logic_error("node " + n.name + " (" + op_name(n.kind) + "): no tensor or sequence parallelism; "
                           "the builder keeps those graphs' add + norm unfused");
  if (!c.native16 && c.out_desc(0).dtype != DType::F32)
    throw std::logic_error("node " + n.name + " (" + op_name(n.kind) + "): 16-bit activations only on the "
                           "16-bit-native path (RUNNER_NATIVE16, a backend with native16_available); the builder "
                           "keeps the pair unfused elsewhere");
}
DType dtype_of(const OpContext& c) { return c.native16 ? c.dtype16() : DType::F32; }
int rows(const OpContext& c) { return static_cast<int>(rows_of(c.in_desc(0))); }
int width(const OpContext& c) { return static_cast<int>(c.in_desc(0).shape.back()); }
// The backward's d(sum) (written over) and d(y): the executor's buffers, or fp32 copies.
void* dsum_of(const OpContext& c) {
  if (!c.dout_own || !c.dout1) throw std::logic_error("node " + c.n.name + ": add + norm's backward needs both outputs' gradients");
  return c.dout_own;
}

std::vector<int> saves_layernorm(const Node& n) { return {n.out[0], n.in[2], n.out[2], n.out[3]}; }  // sum, w, mean, rstd
std::vector<int> saves_rmsnorm(const Node& n) { return {n.out[0], n.in[2], n.out[2]}; }               // sum, w, rstd

void forward_layernorm(OpContext& c) {
  refuse_unfusable(c);
  c.be.run(k::AddLayerNormForward(c.outs[0], c.outs[1], c.out(2), c.out(3), c.ins[0], c.ins[1], c.in(2), c.in(3), rows(c), width(c), c.n.eps), dtype_of(c));
}
void backward_layernorm(OpContext& c) {
  refuse_unfusable(c);
  c.be.run(k::AddLayerNormBackward(c.dins[0], c.dins[1], c.din(2), c.din(3), dsum_of(c), c.dout1, c.outs[0], c.in(2),
                              c.out(2), c.out(3), rows(c), width(c)), dtype_of(c));
}
void forward_rmsnorm(OpContext& c) {
  refuse_unfusable(c);
  c.be.run(k::AddRmsNormForward(c.outs[0], c.outs[1], c.out(2), c.ins[0], c.ins[1], c.in(2), rows(c),
                           width(c), c.n.eps), dtype_of(c));
}
void backward_rmsnorm(OpContext& c) {
  refuse_unfusable(c);
  c.be.run(k::AddRmsNormBackward(c.dins[0], c.dins[1], c.din(2), dsum_of(c), c.dout1, c.outs[0], c.in(2), c.out(2), rows(c), width(c)), dtype_of(c));
}

}  // namespace add_norm

// Figures (ops.h): each fused node counts, moves and is priced as the unfused kinds it
// replaces. The passes it merges are memory-bound ones their calibrated bandwidths price within
// noise (bench/bench_fused.cpp measures the difference, a few percent of the pair), so a plan
// prices the fused and unfused graphs alike. The parts read the fused node's own tensors, laid
// out as theirs: LinearGelu's in (x, W, b) and out[0] (h, of the GELU's shape); AddNorm's out[0]
// (the (N,C) sum, the Add's output and the norm's input, of the norm's output's shape).
namespace fused_figures {

double linear_gelu_flops(const Graph& g, const Node& n, bool backward) {
  return kLinearOp.flops(g, n, backward) + kGeluOp.flops(g, n, backward);
}
OpTrafficParts linear_gelu_traffic(const Graph& g, const Node& n) {
  return traffic_then(kLinearOp.traffic(g, n), kGeluOp.traffic(g, n));
}

double add_layernorm_flops(const Graph& g, const Node& n, bool backward) {
  return kAddOp.flops(g, n, backward) + kLayerNormOp.flops(g, n, backward);
}
OpTrafficParts add_layernorm_traffic(const Graph& g, const Node& n) {
  return traffic_then(kAddOp.traffic(g, n), kLayerNormOp.traffic(g, n));
}
double add_rmsnorm_flops(const Graph& g, const Node& n, bool backward) {
  return kAddOp.flops(g, n, backward) + kRMSNormOp.flops(g, n, backward);
}
OpTrafficParts add_rmsnorm_traffic(const Graph& g, const Node& n) {
  return traffic_then(kAddOp.traffic(g, n), kRMSNormOp.traffic(g, n));
}

// The fc Linear's GEMMs (never sequence-parallel here).
OpGemms linear_gelu_gemms(const Graph& g, const Node& n, bool backward) { return kLinearOp.gemms(g, n, backward); }
// A column-parallel fc's all-reduce of d(x).
OpCollectives linear_gelu_collectives(const Graph& g, const Node& n) { return kLinearOp.collectives(g, n); }

}  // namespace fused_figures
}  // namespace

constinit const OpDef kLinearGeluOp{.kind = OpKind::LinearGelu, .name = "linear_gelu", .saves = linear_gelu::saves,
                                    .scratch = nullptr, .forward = linear_gelu::forward,
                                    .backward = linear_gelu::backward, .consumes_dout = true,
                                    .kernels = kernel_pair<Kernel::LinearGeluForward, Kernel::LinearGeluBackward>, .flops = fused_figures::linear_gelu_flops,
                                    .gemms = fused_figures::linear_gelu_gemms,
                                    .traffic = fused_figures::linear_gelu_traffic,
                                    .collectives = fused_figures::linear_gelu_collectives};

}  // namespace ops

namespace ops {
constinit const OpDef kAddLayerNormOp{.kind = OpKind::AddLayerNorm, .name = "add_layernorm",
                                      .saves = add_norm::saves_layernorm, .scratch = nullptr,
                                      .forward = add_norm::forward_layernorm, .backward = add_norm::backward_layernorm,
                                      .consumes_dout = true, .reads_dout1 = true, .native16 = true,
                                      .native16_params = 0b1100, .kernels = kernel_pair<Kernel::AddLayerNormForward, Kernel::AddLayerNormBackward>, .flops = fused_figures::add_layernorm_flops,
                                      .traffic = fused_figures::add_layernorm_traffic, .residual_outputs = 0b1};
constinit const OpDef kAddRMSNormOp{.kind = OpKind::AddRMSNorm, .name = "add_rmsnorm",
                                    .saves = add_norm::saves_rmsnorm, .scratch = nullptr,
                                    .forward = add_norm::forward_rmsnorm, .backward = add_norm::backward_rmsnorm,
                                    .consumes_dout = true, .reads_dout1 = true, .native16 = true,
                                    .native16_params = 0b100, .kernels = kernel_pair<Kernel::AddRmsNormForward, Kernel::AddRmsNormBackward>, .flops = fused_figures::add_rmsnorm_flops,
                                    .traffic = fused_figures::add_rmsnorm_traffic, .residual_outputs = 0b1};
}  // namespace ops
