// Embedding: token rows of wte plus, optionally, learned positions wpe (ops/ops.h).
//
// in: tokens (B,T) int32, wte (V,C) [tensor parallel: this rank's rows of the vocabulary],
//     wpe (maxT,C) optional.  out: (B*T, C) [sequence parallel: this rank's rows].
// Tensor parallelism (TpMode::VocabEmbed): each rank adds the rows of the tokens in its
// vocabulary shard (wpe on rank 0 only) and the ranks all-reduce the sum; under sequence
// parallelism (scatter_output) they reduce-scatter it instead, each keeping its rows, and the
// backward all-gathers the output gradient back to the whole sequence.
#include "ops/ops.h"

#include <stdexcept>

namespace ops {
namespace {
namespace embedding {

std::vector<int> saves(const Node& n) { return {n.in[0]}; }  // tokens

// Sequence parallelism: the whole sequence's output (forward) or output gradient (backward).
size_t scratch(const Graph& g, const Node& n, bool backward) {
  if (g.sp_parts <= 1 || !n.scatter_output) return 0;
  return static_cast<size_t>(numel_of(g.tensors[n.out[0]].shape) * g.sp_parts) * 4;
}

void forward(OpContext& c) {
  const Node& n = c.n;
  const int C = static_cast<int>(c.out_desc(0).shape.back());
  const float* wpe = c.in(2);
  if (n.tp == TpMode::VocabEmbed) {  // each rank adds its vocabulary rows; wpe once
    const int64_t out_n = numel_of(c.out_desc(0).shape);
    Tensor full;
    float* dst = c.out(0);
    if (n.scatter_output) {  // sequence parallel: sum, and keep this rank's rows
      full = scratch_tensor({out_n * c.g.sp_parts}, false);
      dst = full.data<float>();
    }
    const float* wpe0 = c.tp_rank() == 0 ? wpe : nullptr;
    if (c.g.decode && wpe0) {  // one token per row, each at its own position
      if (!c.kv) throw std::logic_error("node " + n.name + ": a decode graph needs the executor's KV cache (set_kv_cache)");
      for (int b = 0; b < c.B(); ++b)
        c.be.run(k::EmbeddingShardForward(dst + static_cast<int64_t>(b) * C, c.in_i32(0) + b, c.in(1),
                                     wpe0 + static_cast<int64_t>(c.kv->pos[static_cast<size_t>(b)]) * C, 1, 1, C,
                                     static_cast<int>(n.vocab_start), static_cast<int>(c.in_desc(1).shape[0])));
    } else {
      c.be.run(k::EmbeddingShardForward(dst, c.in_i32(0), c.in(1), wpe0, c.B(), c.T(), C, static_cast<int>(n.vocab_start),
                                   static_cast<int>(c.in_desc(1).shape[0])));
    }
    if (n.scatter_output) c.group->reduce_scatter_sum(dst, c.out(0), out_n);
    else c.allreduce(c.out(0), out_n);
  } else if (c.g.decode && wpe) {  // one token per row, each at its own position
    if (!c.kv) throw std::logic_error("node " + n.name + ": a decode graph needs the executor's KV cache (set_kv_cache)");
    for (int b = 0; b < c.B(); ++b)
      c.be.run(k::EmbeddingForward(c.out(0) + static_cast<int64_t>(b) * C, c.in_i32(0) + b, c.in(1),
                             wpe + static_cast<int64_t>(c.kv->pos[static_cast<size_t>(b)]) * C, 1, 1, C));
  } else if (c.native16) {  // (the executor leaves decode and tensor parallelism widened)
    // The tables as stored, in 16 bits (native16_stored): the kernel widens the rows it reads.
    c.be.run(k::EmbeddingForward(c.outs[0], c.in_i32(0), c.ins[1], c.ins[2], c.B(), c.T(), C), c.dtype16());
  } else {
    c.be.run(k::EmbeddingForward(c.out(0), c.in_i32(0), c.in(1), wpe, c.B(), c.T(), C));
  }
}

void backward(OpContext& c) {
  const Node& n = c.n;
  const int C = static_cast<int>(c.out_desc(0).shape.back());
  const float* dout = c.dout;
  Tensor dfull;
  if (n.scatter_output) {  // sequence parallel: the whole sequence's output gradient
    const int64_t out_n = numel_of(c.out_desc(0).shape);
    dfull = scratch_tensor({out_n * c.g.sp_parts}, false);
    c.group->allgather(dout, dfull.data<float>(), out_n);
    dout = dfull.data<float>();
  }
  if (n.tp == TpMode::VocabEmbed)
    c.be.run(k::EmbeddingShardBackward(c.din(1), c.din(2), dout, c.in_i32(0), c.B(), c.T(), C,
                                  static_cast<int>(n.vocab_start), static_cast<int>(c.in_desc(1).shape[0])));
  else if (c.native16)
    c.be.run(k::EmbeddingBackward(c.din(1), c.din(2), dout, c.in_i32(0), c.B(), c.T(), C), c.dtype16());
  else
    c.be.run(k::EmbeddingBackward(c.din(1), c.din(2), dout, c.in_i32(0), c.B(), c.T(), C));
}

}  // namespace embedding

// Figures (ops.h), per element of the output (n of them): one add (wte row + wpe row) forward,
// one scatter-add backward; the forward gathers its rows and writes them (2n), the backward
// reads d(out) and scatters into the tables' gradients (3n, as the probe measures it).
// The vocabulary shard's kernels under tensor parallelism; the whole table is the unsharded pair.
OpKernels embedding_kernels(const Graph&, const Node& n, bool backward, bool) {
  if (n.tp == TpMode::VocabEmbed) return {backward ? Kernel::EmbeddingShardBackward : Kernel::EmbeddingShardForward};
  return {backward ? Kernel::EmbeddingBackward : Kernel::EmbeddingForward};
}

namespace embedding_figures {

double flops(const Graph& g, const Node& n, bool) { return numel_f(g, n.out[0]); }
OpTrafficParts traffic(const Graph& g, const Node& n) { return traffic_of("embedding", nbytes_f(g, n.out[0]), 2, 3); }
// Vocabulary-parallel: each rank's partial embedding of the whole micro-batch (fp32), summed,
// or reduce-scattered under sequence parallelism, whose backward gathers d(out) back.
OpCollectives collectives(const Graph& g, const Node& n) {
  OpCollectives c;
  if (n.tp != TpMode::VocabEmbed) return c;
  const double full = numel_f(g, n.out[0]) * 4.0 * (n.scatter_output ? g.sp_parts : 1);
  c.add(n.scatter_output ? TpCollective::reduce_scatter : TpCollective::all_reduce, full, false);
  if (n.scatter_output) c.add(TpCollective::all_gather, full, true);
  return c;
}
// A vocabulary of 4C.
void probe(ProbeBuilder& p, int64_t N, int64_t C) {
  p.tokens();
  p.param("wte", {4 * C, C});
  p.out("y", {N, C}, false);
}

}  // namespace embedding_figures
}  // namespace

constinit const OpDef kEmbeddingOp{.kind = OpKind::Embedding, .name = "embedding", .saves = embedding::saves,
                                   .scratch = embedding::scratch, .forward = embedding::forward,
                                   .backward = embedding::backward, .native16 = true,
                                   .native16_params = 0b110, .native16_stored = 0b110,
                                   .kernels = embedding_kernels, .flops = embedding_figures::flops, .traffic = embedding_figures::traffic,
                                   .collectives = embedding_figures::collectives, .probe = embedding_figures::probe};

}  // namespace ops
