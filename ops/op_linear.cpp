// Linear: y = x W^T + b (ops/ops.h), with Megatron-LM's tensor parallelism and sequence
// parallelism (Shoeybi et al. 2019; Korthikanti et al. 2022).
//
// in: x (N,IC), W (OC,IC), b (OC) optional.  out: y (N,OC).  (Under tensor parallelism OC or IC
// is this rank's shard; under sequence parallelism N is the rows of the side that is sharded.)
//   Column (TpMode::Column): identity forward; d(x) all-reduced in backward (Megatron's f).
//   Row (TpMode::Row): y all-reduced in forward, the bias added once; identity backward (g).
//   gather_input (sequence parallel, column side): x is all-gathered to the whole sequence
//     in forward, and re-gathered in backward (only the shard is saved); d(x) is
//     reduce-scattered back to this rank's rows.
//   scatter_output (sequence parallel, row side): the partial products are reduce-scattered
//     to this rank's rows; the backward all-gathers d(y).
//
// 16-bit operands: where ops/gemm_path.h chose oneDNN (or, on a GPU, cuBLASLt) for the dtype, the GEMMs read x, W, b and
// d(y) as stored (reads16) and write fp32 (y, rounded by the executor; gradients accumulated).
// Otherwise, and always under sequence parallelism or with operands of mixed dtypes (the logits'
// fp32 d(y)), the executor widens them and sgemm runs.
//
// dout16 (the output layer under precision.logits_grad: compute): the backward reads the
// logits' fp32 d(y) rounded to x's 16-bit format, in every path, so that the numbers do not
// depend on which GEMM path the dtype took: a 16-bit copy that the 16-bit GEMMs read as stored,
// or (sgemm, sequence parallelism) an fp32 copy of the rounded values. Either copy is the
// backward's scratch, counted by the dry run.
#include "ops/gemm_path.h"
#include "ops/ops.h"

namespace ops {
namespace {
namespace linear {

std::vector<int> saves(const Node& n) { return {n.in[0], n.in[1]}; }  // x, W

// oneDNN's 16-bit GEMMs read the operands as stored when all of them (x, W, b, and d(y) in the
// backward) share a 16-bit dtype whose chosen path is oneDNN, outside sequence parallelism
// (its collectives run on fp32 copies).
bool reads16(const Graph& g, const Node& n, bool backward) {
  if (n.gather_input || n.scatter_output) return false;
  const DType t = g.tensors[n.in[0]].dtype;
  if (t != DType::BF16 && t != DType::F16) return false;
  for (int id : n.in)
    if (g.tensors[id].dtype != t) return false;
  if (backward && g.tensors[n.out[0]].dtype != t && !n.dout16) return false;
  return reads_as_stored(gemm_path(t));
}

// dout16's copies of d(y) (backward_dout): 16 bits, and on a widening path an fp32 copy too.
size_t dout16_bytes(const Graph& g, const Node& n, bool backward) {
  if (!backward || !n.dout16) return 0;
  return static_cast<size_t>(numel_of(g.tensors[n.out[0]].shape)) * (reads16(g, n, true) ? 2 : 2 + 4);
}
// dout16's copies, and sequence parallelism's full-sequence temporaries. Forward: the gathered
// x (P shards) or the whole y before its reduce-scatter. Backward: the re-gathered x, the full
// d(x) and this rank's reduce-scattered part of it ((2P + 1) shards of x), or the gathered d(y).
size_t scratch(const Graph& g, const Node& n, bool backward) {
  const size_t d16 = dout16_bytes(g, n, backward);
  if (g.sp_parts <= 1) return d16;
  const int64_t P = g.sp_parts;
  const TensorDesc& x = g.tensors[n.in[0]];
  const TensorDesc& y = g.tensors[n.out[0]];
  if (n.gather_input) return d16 + static_cast<size_t>(numel_of(x.shape) * (backward ? 2 * P + 1 : P)) * 4;
  if (n.scatter_output) return d16 + static_cast<size_t>(numel_of(y.shape) * P) * 4;
  return d16;
}

// d(y) as the backward reads it: c.dout, or under dout16 its rounding to x's format (`r16`),
// widened back into `wide` unless the GEMMs read it as stored.
const void* backward_dout(OpContext& c, Tensor& r16, Tensor& wide) {
  if (!c.n.dout16) return c.dout;
  const DType t = c.in_desc(0).dtype;
  const TensorDesc& y = c.out_desc(0);
  r16 = Tensor::empty(y.shape, t, Account::Workspace);
  c.be.run(k::Convert(r16.raw(), t, c.dout, DType::F32, numel_of(y.shape)));
  if (c.as_stored) return r16.raw();
  wide = scratch_tensor(y.shape, false);
  c.be.run(k::Convert(wide.raw(), DType::F32, r16.raw(), t, numel_of(y.shape)));
  return wide.raw();
}

void forward(OpContext& c) {
  const Node& n = c.n;
  const TensorDesc& x = c.in_desc(0);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  const float* bias = c.in(2);
  const float* xin = c.in(0);
  int64_t nrows = rows_of(x);
  Tensor xfull, yfull;
  if (n.gather_input) {  // sequence parallel: the whole sequence's input
    xfull = scratch_tensor({nrows * c.g.sp_parts, IC}, false);
    c.group->allgather(xin, xfull.data<float>(), numel_of(x.shape));
    xin = xfull.data<float>();
    nrows *= c.g.sp_parts;
  }
  if (n.scatter_output) {  // sequence parallel: partial sums reduce-scattered to this rank's rows
    yfull = scratch_tensor({nrows, OC}, false);
    c.be.run(k::MatmulForward(yfull.data<float>(), xin, c.in(1), nullptr, static_cast<int>(nrows), IC, OC));
    const TensorDesc& y = c.out_desc(0);
    c.group->reduce_scatter_sum(yfull.data<float>(), c.out(0), numel_of(y.shape));
    if (bias)
      for (int64_t r = 0; r < rows_of(y); ++r) c.be.run(k::AddInplace(c.out(0) + r * OC, bias, OC));
    return;
  }
  const bool row = n.tp == TpMode::Row;
  if (row && c.tp_rank() != 0) bias = nullptr;  // partial sums: the bias is added once
  if (c.as_stored)
    c.be.run(k::MatmulForward(c.out(0), c.ins[0], c.ins[1], bias, static_cast<int>(nrows), IC, OC), x.dtype);
  else
    c.be.run(k::MatmulForward(c.out(0), xin, c.in(1), bias, static_cast<int>(nrows), IC, OC));
  if (row) c.allreduce(c.out(0), numel_of(c.out_desc(0).shape));
}

// Sequence-parallel backward: gathers what the forward gathered, scatters what it scattered.
void backward_seq_parallel(OpContext& c) {
  const Node& n = c.n;
  const TensorDesc& x = c.in_desc(0);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  float* dx = c.din(0);
  float* db = c.din(2);
  const float* xin = c.in(0);
  Tensor dy16, dyw;
  const float* dy = static_cast<const float*>(backward_dout(c, dy16, dyw));
  int64_t nrows = rows_of(x);
  Tensor xfull, dyfull, dxfull, dxpart;
  if (n.gather_input) {  // re-gather the input (only the shard was kept)
    xfull = scratch_tensor({nrows * c.g.sp_parts, IC}, false);
    c.group->allgather(xin, xfull.data<float>(), numel_of(x.shape));
    xin = xfull.data<float>();
    nrows *= c.g.sp_parts;
  }
  if (n.scatter_output) {
    const TensorDesc& y = c.out_desc(0);
    // This rank's rows' share of the bias gradient (the caller sums it over tp).
    if (db) c.be.run(k::MatmulBackward(nullptr, nullptr, db, dy, xin, c.in(1), static_cast<int>(rows_of(y)), IC, OC));
    db = nullptr;
    dyfull = scratch_tensor({rows_of(y) * c.g.sp_parts, OC}, false);
    c.group->allgather(dy, dyfull.data<float>(), numel_of(y.shape));
    dy = dyfull.data<float>();
  }
  float* dxf = dx;
  if (n.gather_input && dx) {
    dxfull = scratch_tensor({nrows, IC}, true);
    dxf = dxfull.data<float>();
  }
  c.be.run(k::MatmulBackward(dxf, c.din(1), db, dy, xin, c.in(1), static_cast<int>(nrows), IC, OC));
  if (n.gather_input && dx) {  // reduce-scatter d(input) back to this rank's rows
    dxpart = scratch_tensor(x.shape, false);
    c.group->reduce_scatter_sum(dxfull.data<float>(), dxpart.data<float>(), numel_of(x.shape));
    c.be.run(k::AddInplace(dx, dxpart.data<float>(), numel_of(x.shape)));
  }
}

void backward(OpContext& c) {
  const Node& n = c.n;
  if (n.gather_input || n.scatter_output) return backward_seq_parallel(c);
  const TensorDesc& x = c.in_desc(0);
  const TensorDesc& w = c.in_desc(1);
  const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
  float* dx = c.din(0);
  Tensor dy16, dyw;
  const void* dy = backward_dout(c, dy16, dyw);
  if (c.as_stored)
    c.be.run(k::MatmulBackward(dx, c.din(1), c.din(2), dy, c.ins[0], c.ins[1], static_cast<int>(rows_of(x)),
                           IC, OC), x.dtype);
  else
    c.be.run(k::MatmulBackward(dx, c.din(1), c.din(2), static_cast<const float*>(dy), c.in(0), c.in(1),
                         static_cast<int>(rows_of(x)), IC, OC));
  // Column-parallel: each rank holds part of d(input); the input's only reader is this
  // node (a norm's output), so its gradient buffer holds exactly this sum's terms.
  if (n.tp == TpMode::Column && dx) c.allreduce(dx, numel_of(x.shape));
}

}  // namespace linear

// Figures (ops.h). y (rows, OC) = x (rows, IC) W^T with W (OC, IC); under sequence parallelism
// x is gathered first, so the products run over the whole micro-batch's rows.
namespace linear_figures {

int64_t rows(const Graph& g, const Node& n) {
  return g.tensors[static_cast<size_t>(n.in[0])].shape[0] * (n.gather_input ? g.sp_parts : 1);
}

// Forward: one product; backward: d(x) = d(y) W and d(W) = d(y)^T x, each as large.
double flops(const Graph& g, const Node& n, bool backward) {
  const double r = dim_f(g, n.in[0], 0) * (n.gather_input ? g.sp_parts : 1);
  const double fwd = 2.0 * r * dim_f(g, n.in[1], 0) * dim_f(g, n.in[1], 1);
  return backward ? 2.0 * fwd : fwd;
}

// Forward (rows, OC, IC); backward d(x) (rows, IC, OC) and d(W) (OC, IC, rows).
OpGemms gemms(const Graph& g, const Node& n, bool backward) {
  const int64_t m = rows(g, n);
  const int64_t oc = g.tensors[static_cast<size_t>(n.in[1])].shape[0], ic = g.tensors[static_cast<size_t>(n.in[1])].shape[1];
  OpGemms r;
  if (!backward) {
    r.shapes[0] = {m, oc, ic};
    r.count = 1;
  } else {
    r.shapes[0] = {m, ic, oc};
    r.shapes[1] = {oc, ic, m};
    r.count = 2;
  }
  return r;
}

// The bias: added to y (fp32: read and written) in the forward, its gradient a column sum of
// d(y) in the backward, one call each at the "linear" bandwidth. Without it the GEMM's call is
// a launch.
OpTrafficParts traffic(const Graph& g, const Node& n) {
  OpTrafficParts t;
  t.count = 1;
  if (n.in.size() > 2) {
    const double y_bytes = static_cast<double>(rows(g, n) * g.tensors[static_cast<size_t>(n.in[1])].shape[0]) * 4.0;
    t.parts[0] = {"linear", 2.0 * y_bytes, y_bytes};
  }
  return t;
}

// Sequence parallelism gathers x to the whole micro-batch first (forward, and again in the
// backward) and reduce-scatters d(x); its row side reduce-scatters y and gathers d(y). Without
// it, a row-parallel Linear all-reduces y, a column-parallel one d(x) (Megatron's g and f).
OpCollectives collectives(const Graph& g, const Node& n) {
  const int64_t m = rows(g, n);
  const int64_t oc = g.tensors[static_cast<size_t>(n.in[1])].shape[0], ic = g.tensors[static_cast<size_t>(n.in[1])].shape[1];
  const double y_bytes = static_cast<double>(m * oc) * 4.0, x_bytes = static_cast<double>(m * ic) * 4.0;
  OpCollectives c;
  if (n.gather_input) {
    c.add(TpCollective::all_gather, x_bytes, false);
    c.add(TpCollective::all_gather, x_bytes, true);
    c.add(TpCollective::reduce_scatter, x_bytes, true);
  }
  if (n.scatter_output) {
    c.add(TpCollective::reduce_scatter, y_bytes, false);
    c.add(TpCollective::all_gather, y_bytes, true);
  }
  if (n.tp == TpMode::Row && !n.scatter_output) c.add(TpCollective::all_reduce, y_bytes, false);
  if (n.tp == TpMode::Column && !n.gather_input) c.add(TpCollective::all_reduce, x_bytes, true);
  return c;
}

}  // namespace linear_figures
}  // namespace

constinit const OpDef kLinearOp{.kind = OpKind::Linear, .name = "linear", .saves = linear::saves,
                                .scratch = linear::scratch, .forward = linear::forward, .backward = linear::backward,
                                .reads16 = linear::reads16, .kernels = kernel_pair<Kernel::MatmulForward, Kernel::MatmulBackward>, .flops = linear_figures::flops,
                                .gemms = linear_figures::gemms, .traffic = linear_figures::traffic,
                                .collectives = linear_figures::collectives};

}  // namespace ops
