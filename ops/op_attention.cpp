// Attention's operators: rotary position embedding and causal self-attention (ops/ops.h).
//
// Rope       in: qkv (B*T, W).  out: (B*T, W), q and k rotated, v copied.
// Attention  in: qkv (B*T, W).  out: y (B*T, C'), lse (B, NH', T) fp32 saved for backward
//            (flash-style: the (T, T) probabilities are never kept; ops/backend.h).
// W = C' + 2 NKV' HS: the query heads, then the key-value heads (grouped-query attention,
// ops/backend.h, Heads). C' = C/tp and NH' = NH/tp under tensor parallelism: a rank holds
// whole query heads [head_start, head_start + NH'), and either its share of the key-value
// heads (NKV/tp, when tp divides them) or all of them (replicated), so neither needs a
// collective; the attention's dropout counters are those of the logical head in the whole
// model, so a head shard draws the masks the unsharded model draws (DropoutSpec::heads_total).
// A grouped backward takes a workspace (k::AttentionBackward::work_floats), counted by the
// dry run like every op's scratch. In a bf16/fp16 run the attention reads qkv
// and dout and writes out and dqkv as stored (the AttentionForward / AttentionBackward BF16 and F16 entries), so
// the executor makes no fp32 copy of them; lse and the grouped workspace stay fp32. A prefill
// graph (a KV cache to fill: kv_cache_write reads fp32) keeps the widened path (the executor's
// native16_call).
#include "ops/ops.h"

#include <stdexcept>
#include <string>

namespace ops {
namespace {

// C: the query channels of a packed qkv row of W = C + 2 NKV HS (both operators' input).
int query_channels(const Graph& g, const Node& n) {
  const Heads h = heads_of(n);
  return static_cast<int>(g.tensors[static_cast<size_t>(n.in[0])].shape.back() * h.q / (h.q + 2 * h.kv));
}
int query_channels(const OpContext& c) { return query_channels(c.g, c.n); }

namespace rope {

void forward(OpContext& c) {
  if (c.native16)
    return c.be.run(k::RopeForward(c.outs[0], c.ins[0], c.B(), c.T(), query_channels(c), heads_of(c.n),
                               c.n.theta), c.dtype16());
  c.be.run(k::RopeForward(c.out(0), c.in(0), c.B(), c.T(), query_channels(c), heads_of(c.n), c.n.theta));
}

void backward(OpContext& c) {
  if (c.native16)
    return c.be.run(k::RopeBackward(c.dins[0], c.dout, c.B(), c.T(), query_channels(c), heads_of(c.n),
                                c.n.theta), c.dtype16());
  c.be.run(k::RopeBackward(c.din(0), c.dout, c.B(), c.T(), query_channels(c), heads_of(c.n), c.n.theta));
}

}  // namespace rope

namespace attention {

// qkv, lse (a decode graph's attention has no lse and no backward)
std::vector<int> saves(const Node& n) {
  if (n.out.size() < 2) return {n.in[0]};
  return {n.in[0], n.out[1]};
}

// Counters of the logical head in the whole model (ops/backend.h, DropoutSpec): a sample's
// mask elements are the whole model's probabilities, heads_total * T * T (lse's shape is
// (B, NH', T): its last dimension is T).
DropoutSpec drop(const OpContext& c) {
  const Node& n = c.n;
  const int total = n.heads_total > 0 ? n.heads_total : n.heads;
  const int64_t T = c.out_desc(1).shape.back();
  DropoutSpec d = c.dropout(T * T * total);
  d.heads_total = total;
  d.head_start = n.head_start;
  return d;
}

// With a KV cache (generation): a prefill graph attends as in training and stores this
// layer's K and V; a decode graph attends one position per row over the cache (rope, when the
// model has it, applied there at each row's position: the decode graph has no Rope node).
void forward(OpContext& c) {
  const int C = query_channels(c);
  const Heads heads = heads_of(c.n);
  if (c.g.decode) {
    if (!c.kv || !c.kv->has_layer(c.n.layer))
      throw std::logic_error("node " + c.n.name + ": a decode graph needs the executor's KV cache (set_kv_cache)");
    if (static_cast<int64_t>(c.kv->pos.size()) < c.B()) throw std::logic_error("KV cache: fewer positions than rows");
    c.be.run(k::AttentionDecode(c.out(0), c.in(0), c.kv->layer(c.n.layer), c.kv->device_positions(), c.B(), C, heads,
                          c.n.rope ? c.n.theta : 0.0f));
    return;
  }
  if (c.native16)  // qkv and out as stored; lse fp32
    return c.be.run(k::AttentionForward(c.outs[0], c.out(1), c.ins[0], c.B(), c.T(), C, heads, drop(c)), c.dtype16());
  c.be.run(k::AttentionForward(c.out(0), c.out(1), c.in(0), c.B(), c.T(), C, heads, drop(c)));
  if (c.kv) c.be.run(k::KvCacheWrite(c.kv->layer(c.n.layer), c.in(0), c.B(), c.T(), C, heads));
}

int64_t work_floats(const Graph& g, const Node& n) {
  return k::AttentionBackward::work_floats(static_cast<int>(g.B), static_cast<int>(g.T), query_channels(g, n), heads_of(n));
}

// The grouped backward's workspace (forward: none).
size_t scratch(const Graph& g, const Node& n, bool backward) {
  if (!backward || g.decode) return 0;
  return static_cast<size_t>(work_floats(g, n)) * sizeof(float);
}

void backward(OpContext& c) {
  const int C = query_channels(c);
  if (c.g.decode) throw std::logic_error("node " + c.n.name + ": a decode graph has no backward");
  const int64_t nwork = work_floats(c.g, c.n);
  Tensor work;
  if (nwork > 0) work = scratch_tensor({nwork}, false);
  if (c.native16)
    return c.be.run(k::AttentionBackward(c.dins[0], c.dout, c.ins[0], c.out(1), c.B(), c.T(), C,
                                     heads_of(c.n), drop(c), nwork > 0 ? work.data<float>() : nullptr), c.dtype16());
  c.be.run(k::AttentionBackward(c.din(0), c.dout, c.in(0), c.out(1), c.B(), c.T(), C, heads_of(c.n), drop(c),
                          nwork > 0 ? work.data<float>() : nullptr));
}

}  // namespace attention

// Figures (ops.h).
// Decoding reads the KV cache (no backward); a prefill that fills the cache also writes it.
OpKernels attention_kernels(const Graph& g, const Node&, bool backward, bool kv_cache) {
  if (g.decode) return backward ? OpKernels{} : OpKernels{Kernel::AttentionDecode};
  if (backward) return {Kernel::AttentionBackward};
  if (kv_cache) return {Kernel::AttentionForward, Kernel::KvCacheWrite};
  return {Kernel::AttentionForward};
}

namespace attention_figures {

// Rope: a rotation of q and k, about 4 operations per element either way (the backward rotates
// back); it reads and writes the (B*T, W) tensor once each way (2n bytes-units).
double rope_flops(const Graph& g, const Node& n, bool) { return 4.0 * numel_f(g, n.out[0]); }
OpTrafficParts rope_traffic(const Graph& g, const Node& n) { return traffic_of("rope", nbytes_f(g, n.out[0]), 2, 2); }

// Attention: out (B*T, C'), lse (B, NH', T). Causal, so T(T+1)/2 query-key pairs per query head
// (grouped-query attention shares K and V, not this work). Forward: S = QK^T and O = PV, 2 HS
// each per pair, the softmax about 5. Backward: S again from lse, then dV, dP, dQ and dK, 2 HS
// each, the softmax's gradient about 5.
double flops(const Graph& g, const Node& n, bool backward) {
  const double NHl = dim_f(g, n.out[1], 1), T = dim_f(g, n.out[1], 2), B = dim_f(g, n.out[1], 0);
  const double HS = dim_f(g, n.out[0], 1) / NHl;
  const double pairs = B * NHl * T * (T + 1) / 2.0;
  return pairs * ((backward ? 10.0 : 4.0) * HS + 5.0);
}
// This rank's heads (from lse), the head size from the output.
AttentionShape shape(const Graph& g, const Node& n) {
  const std::vector<int64_t>& lse = g.tensors[static_cast<size_t>(n.out[1])].shape;
  const int64_t heads = lse[1];
  return {lse[0] * heads, lse[2], g.tensors[static_cast<size_t>(n.out[0])].shape[1] / heads};
}
// Its time is the attention rate's; the call's launch on top.
OpTrafficParts traffic(const Graph&, const Node&) {
  OpTrafficParts t;
  t.count = 1;
  return t;
}

}  // namespace attention_figures
}  // namespace

constinit const OpDef kRopeOp{.kind = OpKind::Rope, .name = "rope", .saves = saves_nothing, .scratch = nullptr,
                              .forward = rope::forward, .backward = rope::backward, .native16 = true,
                              .kernels = kernel_pair<Kernel::RopeForward, Kernel::RopeBackward>, .flops = attention_figures::rope_flops, .traffic = attention_figures::rope_traffic};
constinit const OpDef kAttentionOp{.kind = OpKind::Attention, .name = "attention", .saves = attention::saves,
                                   .scratch = attention::scratch, .forward = attention::forward,
                                   .backward = attention::backward, .native16 = true,
                                   .kernels = attention_kernels, .flops = attention_figures::flops, .attention = attention_figures::shape,
                                   .traffic = attention_figures::traffic};

}  // namespace ops
