// The loss: fused softmax cross-entropy (ops/ops.h).
//
// in: logits (N,V) [tensor parallel: this rank's vocabulary columns], targets (N) int32.
// out: losses (N) per position [, probs (N,V) unless `inplace`: then the probabilities
// overwrite the logits]. Saves the probabilities (in the logits' buffer) and the targets.
// Its backward seeds the chain (OpDef::seeds_backward): it scales by dloss instead of reading
// an output gradient, and writes dlogits over the probabilities.
// Tensor parallelism (TpMode::VocabXent, Megatron-LM): the row max and the sums are
// all-reduced between the three phases of the forward, never gathering the logits.
#include "ops/ops.h"

namespace ops {
namespace {
namespace softmax_xent {

std::vector<int> saves(const Node& n) { return {n.in[0], n.in[1]}; }  // probs (in place of logits), targets

void forward(OpContext& c) {
  const Node& n = c.n;
  const TensorDesc& x = c.in_desc(0);
  float* probs = n.inplace ? c.in(0) : c.out(1);
  const int N = static_cast<int>(rows_of(x)), V = static_cast<int>(x.shape.back()),
            Vr = static_cast<int>(n.vocab_real);
  if (n.tp == TpMode::VocabXent) {
    // rowmax, sumexp, tlogit: kernel operands, so device memory (a workspace temporary that
    // scratch() reports), all-reduced through the group's tensor-memory calls.
    Tensor stats = scratch_tensor({3 * static_cast<int64_t>(N)}, false);
    float* mx = stats.data<float>();
    float* se = mx + N;
    float* tl = se + N;
    c.be.run(k::XentShardMax(mx, c.in(0), N, V, Vr));
    c.group->allreduce_max(mx, N);
    c.be.run(k::XentShardSumexp(se, tl, c.in(0), mx, c.in_i32(1), N, V, Vr, static_cast<int>(n.vocab_start)));
    c.group->allreduce_sum(se, 2 * static_cast<int64_t>(N));  // sumexp and tlogit are adjacent
    c.be.run(k::XentShardFinish(c.out(0), probs, c.in(0), mx, se, tl, c.in_i32(1), N, V, Vr));
  } else {
    c.be.run(k::SoftmaxXentForward(c.out(0), probs, c.in(0), c.in_i32(1), N, V, Vr));
  }
}

// The vocabulary-parallel forward's row statistics (rowmax, sumexp, tlogit: 3 floats a row).
size_t scratch(const Graph& g, const Node& n, bool backward) {
  if (backward || n.tp != TpMode::VocabXent) return 0;
  return 3 * static_cast<size_t>(rows_of(g.tensors[static_cast<size_t>(n.in[0])])) * sizeof(float);
}

// c.din(0) is the logits' own buffer (seeds_backward): dlogits overwrite the probabilities.
void backward(OpContext& c) {
  const Node& n = c.n;
  const TensorDesc& x = c.in_desc(0);
  const int N = static_cast<int>(rows_of(x)), V = static_cast<int>(x.shape.back());
  if (n.tp == TpMode::VocabXent)
    c.be.run(k::XentShardBackward(c.din(0), c.in(0), c.in_i32(1), c.dloss, N, V, static_cast<int>(n.vocab_real),
                             static_cast<int>(n.vocab_start)));
  else
    c.be.run(k::SoftmaxXentBackward(c.din(0), c.in(0), c.in_i32(1), c.dloss, N, V, static_cast<int>(n.vocab_real)));
}

}  // namespace softmax_xent

// The vocabulary shard's forward is three passes around two all-reduces (row max; sum-exp and
// the target's logit; the losses).
OpKernels xent_kernels(const Graph&, const Node& n, bool backward, bool) {
  if (n.tp == TpMode::VocabXent)
    return backward ? OpKernels{Kernel::XentShardBackward}
                    : OpKernels{Kernel::XentShardMax, Kernel::XentShardSumexp, Kernel::XentShardFinish};
  return {backward ? Kernel::SoftmaxXentBackward : Kernel::SoftmaxXentForward};
}

// Figures (ops.h), over the (rows, V) fp32 logits (n elements), not its small output. FLOPs,
// rough: max, exp, sum, log and the target's pick (5) forward; p minus the one-hot and the
// scale (2) backward. Bytes: two reads or writes of the logits each way.
namespace loss_figures {

double flops(const Graph& g, const Node& n, bool backward) { return (backward ? 2.0 : 5.0) * numel_f(g, n.in[0]); }
OpTrafficParts traffic(const Graph& g, const Node& n) { return traffic_of("softmax_xent", nbytes_f(g, n.in[0]), 2, 2); }
// Vocabulary-parallel: the row max, then the sum-exp and the target logit per row, all-reduced.
OpCollectives collectives(const Graph& g, const Node& n) {
  OpCollectives c;
  if (n.tp != TpMode::VocabXent) return c;
  const double rows = dim_f(g, n.in[0], 0);
  c.add(TpCollective::all_reduce, rows * 4.0, false);
  c.add(TpCollective::all_reduce, rows * 8.0, false);
  return c;
}
// A vocabulary of 4C, the probabilities over the logits.
void probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.x({N, 4 * C});
  p.targets();
  p.out("losses", {N}, true);
  p.node().inplace = true;
  p.node().vocab_real = 4 * C;
}

}  // namespace loss_figures
}  // namespace

constinit const OpDef kSoftmaxXentOp{.kind = OpKind::SoftmaxXent, .name = "softmax_xent",
                                     .saves = softmax_xent::saves, .scratch = softmax_xent::scratch,
                                     .forward = softmax_xent::forward, .backward = softmax_xent::backward,
                                     .seeds_backward = true, .kernels = xent_kernels, .flops = loss_figures::flops,
                                     .traffic = loss_figures::traffic, .collectives = loss_figures::collectives,
                                     .probe = loss_figures::probe};

}  // namespace ops
