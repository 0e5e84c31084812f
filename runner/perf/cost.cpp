// The cost model (cost.h): a plan's step time on a hardware profile, from the plan's own graphs.
//
// Every number comes from walking the layout's per-virtual-stage graphs (the ones the ledger
// dry-runs and the recompute planner prices: invariant 1) and pricing each node with the
// profile: GEMMs by shape, attention by its rate, the rest by the bytes it moves; recomputed
// nodes once more in the backward; tensor-parallel collectives where the node's OpDef makes
// them (blocking, so exposed). The data-parallel gradient buckets are rebuilt exactly as
// parallel/grad_sync.cpp builds them and replayed against the backward of the last
// micro-batch, as the runner overlaps them. docs/search.md ("The cost model") has the formulas.
#include "runner/perf/cost.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ops/ops.h"
#include "parallel/grid.h"
#include "runner/device/devices.h"
#include "runner/errors.h"

namespace runner {

double StepCost::comm_exposed_s() const {
  double s = 0;
  for (const auto& [group, secs] : comm_exposed) s += secs;
  return s;
}
double StepCost::comm_share() const { return step_s > 0 ? comm_exposed_s() / step_s : 0; }

nlohmann::json StepCost::to_json() const {
  nlohmann::json total = nlohmann::json::object(), exposed = nlohmann::json::object();
  for (const auto& [g, s] : comm_total) total[g] = s;
  for (const auto& [g, s] : comm_exposed) exposed[g] = s;
  return {{"step_s", step_s},
          {"tokens_per_s", tokens_per_s},
          {"mfu", mfu},
          {"tflops_per_device", tflops_per_device},
          {"threads", threads},
          {"breakdown",
           {{"compute", compute},
            {"recompute", recompute},
            {"bubble", bubble},
            {"optimizer", optimizer},
            {"data", data},
            {"comm_exposed_s", comm_exposed_s()},
            {"comm_total", total},
            {"comm_exposed", exposed}}}};
}

namespace {

// Ranks on one node: the device kind's devices_per_node on a GPU; on the CPU a "device" is a
// rank, and mpirun on one machine packs the world onto hardware.nodes machines.
int64_t ranks_per_node(const Plan& p, const HardwareProfile& hw) {
  if (device_kind(p.recipe.hardware).host) {
    const int64_t nodes = std::max<int64_t>(1, hw.nodes);
    return std::max<int64_t>(1, (p.world + nodes - 1) / nodes);
  }
  return std::max<int64_t>(1, hw.devices_per_node);
}

// Whether some group along `axis` ('t', 'd', 'p') has members on two nodes, with the runner's
// rank order (parallel/grid.h: tp fastest, then dp, then pp) and ranks filling nodes in order.
bool crosses_nodes(const Plan& p, int64_t node, char axis) {
  const parallel::GridShape g{static_cast<int>(p.dp), static_cast<int>(p.tp), static_cast<int>(p.pp)};
  for (int r = 0; r < g.world(); ++r) {
    parallel::Coords c = parallel::coords_of(g, r);
    (axis == 't' ? c.tp : axis == 'd' ? c.dp : c.pp) = 0;
    if (parallel::world_rank_of(g, c) / node != r / node) return true;
  }
  return false;
}

struct Ctx {
  const Plan& p;
  const HardwareProfile& hw;
  int threads = 0;
  std::string dtype;      // GEMM and attention dtype: precision.compute
  bool tp_inter = false;  // the tensor-parallel group crosses nodes
  bool host = false;      // a host (CPU) device: its profile measured this executor's kernels
  double coll(Collective op, int64_t ranks, double bytes, bool inter) const {
    return ranks > 1 ? hw.collective_seconds(op, static_cast<int>(ranks), bytes, inter) : 0.0;
  }
  double tp(Collective op, double bytes) const { return coll(op, p.tp, bytes, tp_inter); }
  // The fixed cost of one op call (HardwareProfile::op_seconds includes it; GEMMs do not).
  double launch() const { return hw.at_threads(threads).launch_s; }
  // CPU ranks of one node with more threads among them than it has cores time-slice them:
  // each op takes `oversubscribed` (threads x ranks / cores, at least 1) times as long. Below
  // that a rank runs at its thread count's measured rate: two single-threaded ranks on two
  // cores were not slowed by each other on this machine (bench/README.md: dp2 on 2 x 1 threads
  // 1.10-1.12x one rank on 2 threads; the calibration measures each thread count alone).
  double oversubscribed = 1;
  template <class F> double shared(F f) const { return oversubscribed * f(threads); }
  double gemm(int64_t m, int64_t n, int64_t k) const { return gemm_as(dtype, m, n, k); }
  double gemm_as(const std::string& dt, int64_t m, int64_t n, int64_t k) const {
    return shared([&](int t) { return hw.gemm_seconds(dt, m, n, k, t); });
  }
  double op(const std::string& kind, double bytes) const {
    return shared([&](int t) { return hw.op_seconds(kind, bytes, t); });
  }
  double attention(int64_t bh, int64_t seq, int64_t hd, bool backward) const {
    return shared([&](int t) { return hw.attention_seconds(dtype, bh, seq, hd, backward, t); });
  }
};

// One node's seconds for one micro-batch: compute (forward, backward) and its tensor-parallel
// collectives (forward, backward).
struct NodeCost {
  double fwd = 0, bwd = 0, tp_fwd = 0, tp_bwd = 0;
};

double tensor_bytes(const ops::Graph& g, int id) { return static_cast<double>(g.tensors[static_cast<size_t>(id)].nbytes()); }

// A node's GEMMs (OpDef::gemms), by shape.
NodeCost gemm_cost(const Ctx& c, const ops::Graph& g, const ops::Node& n, const ops::OpDef& op) {
  NodeCost k;
  // On a host device the executor widens a 16-bit Linear to fp32 and runs sgemm where its
  // operands do not share one 16-bit dtype (ops/op_linear.cpp, reads16), in the backward also
  // where d(y) is fp32: the logits' under precision.logits_grad: fp32. Priced at fp32's GEMM
  // rate there: the CPU profile measured these kernels. Not priced: the widening under sequence
  // parallelism (its collectives run on fp32 copies), and anything on a GPU, whose profile
  // models the published runs it was fitted to (16-bit GEMMs throughout) rather than this
  // executor: its CUDA path widens the same GEMMs (unmeasured; docs/search.md).
  auto dtype_of = [&](int id) { return g.tensors[static_cast<size_t>(id)].dtype; };
  bool wide_fwd = false, wide_bwd = false;
  if (c.host && c.dtype != "fp32") {
    for (int id : n.in) wide_fwd = wide_fwd || dtype_of(id) != dtype_of(n.in[0]);
    wide_bwd = wide_fwd || (!n.dout16 && dtype_of(n.out[0]) != dtype_of(n.in[0]));
  }
  const std::string fwd_dt = wide_fwd ? "fp32" : c.dtype, bwd_dt = wide_bwd ? "fp32" : c.dtype;
  const ops::OpGemms fwd = op.gemms(g, n, false), bwd = op.gemms(g, n, true);
  for (int i = 0; i < fwd.count; ++i) {
    const ops::GemmShape& s = fwd.shapes[static_cast<size_t>(i)];
    k.fwd += c.gemm_as(fwd_dt, s.m, s.n, s.k);
  }
  for (int i = 0; i < bwd.count; ++i) {
    const ops::GemmShape& s = bwd.shapes[static_cast<size_t>(i)];
    k.bwd += c.gemm_as(bwd_dt, s.m, s.n, s.k);
  }
  return k;
}

Collective collective_of(ops::TpCollective op) {
  switch (op) {
    case ops::TpCollective::all_gather: return Collective::all_gather;
    case ops::TpCollective::reduce_scatter: return Collective::reduce_scatter;
    case ops::TpCollective::all_reduce: break;
  }
  return Collective::all_reduce;
}

// One node from its OpDef's figures: its GEMMs by shape, attention at the profile's attention
// rate, then the bytes each memory-bound part moves at its kind's calibrated bandwidth
// (op_seconds counts the op call's launch; a part without a kind is a call priced as its launch
// alone, as GEMMs and attention do not include it). The byte units are those `runner calibrate`
// measured each kind's bandwidth in (its probes, the OpDef's), so that a node of the calibrated
// shape is priced at exactly its measured forward + backward time. A fused node's parts are
// those of the unfused kinds it replaces. Then its tensor-parallel collectives.
NodeCost node_cost(const Ctx& c, const ops::Graph& g, const ops::Node& n) {
  const ops::OpDef& op = ops::op_def(n.kind);
  NodeCost k;
  if (op.gemms) k = gemm_cost(c, g, n, op);
  if (op.attention) {
    const ops::AttentionShape a = op.attention(g, n);
    k.fwd += c.attention(a.batch_heads, a.seq, a.head_dim, false);
    k.bwd += c.attention(a.batch_heads, a.seq, a.head_dim, true);
  }
  if (op.traffic) {
    const ops::OpTrafficParts t = op.traffic(g, n);
    for (int i = 0; i < t.count; ++i) {
      const ops::OpTraffic& part = t.parts[static_cast<size_t>(i)];
      k.fwd += part.kind ? c.op(part.kind, part.forward) : c.launch();
      k.bwd += part.kind ? c.op(part.kind, part.backward) : c.launch();
    }
  }
  if (op.collectives && c.p.tp > 1) {  // blocking, so exposed
    const ops::OpCollectives t = op.collectives(g, n);
    for (int i = 0; i < t.count; ++i) {
      const ops::OpCollective& call = t.calls[static_cast<size_t>(i)];
      (call.backward ? k.tp_bwd : k.tp_fwd) += c.tp(collective_of(call.op), call.bytes);
    }
  }
  return k;
}

// One micro-batch through one virtual stage.
struct ChunkCost {
  double fwd = 0, bwd = 0, rec = 0;           // compute
  double tp_fwd = 0, tp_bwd = 0, tp_rec = 0;  // tensor-parallel collectives
  double pp_fwd = 0, pp_bwd = 0;              // the blocking receives of activations / gradients
  double pp_total = 0;                        // sends and receives
  std::vector<double> bwd_end;                // per node: backward seconds until its backward is done
  std::map<int, std::pair<double, double>> layer;  // per transformer layer: forward, backward (+ recompute)
  double f() const { return fwd + tp_fwd + pp_fwd; }
  double b() const { return bwd + rec + tp_bwd + tp_rec + pp_bwd; }
};

ChunkCost chunk_cost(const Ctx& c, int vstage) {
  const ops::Graph& g = c.p.layout->graph(vstage);
  ChunkCost k;
  std::vector<double> node_bwd(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ops::Node& n = g.nodes[i];
    const NodeCost nc = node_cost(c, g, n);
    k.fwd += nc.fwd;
    k.bwd += nc.bwd;
    k.tp_fwd += nc.tp_fwd;
    k.tp_bwd += nc.tp_bwd;
    node_bwd[i] = nc.bwd + nc.tp_bwd;
    if (n.recompute) {  // its forward again, in the backward of its segment
      k.rec += nc.fwd;
      k.tp_rec += nc.tp_fwd;
      node_bwd[i] += nc.fwd + nc.tp_fwd;
    }
    if (n.layer >= 0) {
      auto& [lf, lb] = k.layer[n.layer];
      lf += nc.fwd + nc.tp_fwd;
      lb += node_bwd[i];
    }
  }
  // Backward runs the nodes in reverse: node i's gradients are final after the nodes after it.
  k.bwd_end.assign(g.nodes.size(), 0);
  double t = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) k.bwd_end[i] = t += node_bwd[i];
  // Pipeline messages: (B*T, C) activations in the compute dtype (this rank's sequence shard
  // under sequence parallelism), received before the forward and (their gradients) before the
  // backward; the sends do not block.
  const int V = c.p.layout->vstages();
  if (V > 1) {
    const int out = g.stage_output >= 0 ? g.stage_output : g.stage_input;
    const double msg = tensor_bytes(g, out);
    const bool inter = crosses_nodes(c.p, ranks_per_node(c.p, c.hw), 'p');
    const double t_msg = c.coll(Collective::send_recv, 2, msg, inter);
    if (vstage > 0) k.pp_fwd = t_msg;
    if (vstage < V - 1) k.pp_bwd = t_msg;
    k.pp_total = 2.0 * (k.pp_fwd + k.pp_bwd);
  }
  return k;
}

// The critical stage's totals for one micro-batch (all its chunks) and its chunks' costs.
struct StageCost {
  int stage = 0;
  std::vector<const ChunkCost*> chunks;  // chunk k: virtual stage k*P + stage
  double fwd = 0, bwd = 0, rec = 0, tp = 0, pp = 0, pp_total = 0, f = 0, b = 0;
};

StageCost stage_cost(const std::vector<ChunkCost>& all, int stage, int P) {
  StageCost s;
  s.stage = stage;
  for (size_t v = static_cast<size_t>(stage); v < all.size(); v += static_cast<size_t>(P)) {
    const ChunkCost& k = all[v];
    s.chunks.push_back(&k);
    s.fwd += k.fwd;
    s.bwd += k.bwd;
    s.rec += k.rec;
    s.tp += k.tp_fwd + k.tp_bwd + k.tp_rec;
    s.pp += k.pp_fwd + k.pp_bwd;
    s.pp_total += k.pp_total;
    s.f += k.f();
    s.b += k.b();
  }
  return s;
}

// When each of the stage's parameters has its final gradient, in seconds from the start of the
// last micro-batch's backward on this stage: after the backward of the first node (in forward
// order) that reads it (runner/train/rank_model.cpp), its chunks' backwards running last chunk
// first. Indexed like stage_params(stage).
std::vector<double> grad_ready_times(const Ctx& c, const StageCost& s) {
  const ModelLayout& lay = *c.p.layout;
  const int P = lay.pp(), V = static_cast<int>(lay.chunks());
  std::vector<double> start(static_cast<size_t>(V), 0);  // chunk k's backward starts after chunks > k
  for (int k = V - 2; k >= 0; --k)
    start[static_cast<size_t>(k)] = start[static_cast<size_t>(k + 1)] + s.chunks[static_cast<size_t>(k + 1)]->bwd_end.front();
  // The first chunk holding a parameter is where the rank reads it (rank_model.cpp): one pass
  // over each chunk's nodes, in forward order, finds every parameter's first reader.
  std::unordered_map<std::string, double> at;
  for (int k = 0; k < V; ++k) {
    const ops::Graph& g = lay.graph(k * P + s.stage);
    for (size_t n = 0; n < g.nodes.size(); ++n)
      for (int id : g.nodes[n].in) {
        const ops::TensorDesc& d = g.tensors[static_cast<size_t>(id)];
        if (d.kind == ops::TensorKind::Param)
          at.try_emplace(d.name, start[static_cast<size_t>(k)] + s.chunks[static_cast<size_t>(k)]->bwd_end[n]);
      }
  }
  std::vector<double> ready;
  for (int i : lay.stage_params(s.stage)) {
    auto it = at.find(lay.params()[static_cast<size_t>(i)].name);
    ready.push_back(it == at.end() ? 0.0 : it->second);
  }
  return ready;
}

// Data parallelism on the critical stage, as parallel/grad_sync.cpp does it: buckets of about
// bucket_mb of gradients in reverse parameter order (whole parameters, padded to a multiple of
// dp; the tied embedding left out under pp), each launched when its last gradient is final
// during the last micro-batch's backward, one at a time on the link. What ends after that
// backward is exposed. ZeRO-1: reduce-scatter, then all-gather of the updated values (exposed).
// ZeRO-2 and 3: the same reduce-scatter after every micro-batch's backward, each against its own
// backward (a rank holds only its shard of the gradients, so they cannot accumulate in full
// over the micro-batches); ZeRO-2 all-gathers the updated values as ZeRO-1, ZeRO-3 does not
// (each forward gathers what it needs: zero3_gathers).
struct DpCost {
  double total = 0, exposed = 0;
  int buckets = 0;
};

DpCost dp_cost(const Ctx& c, const StageCost& s, bool inter, double gbytes, double wbytes) {
  DpCost d;
  const Plan& p = c.p;
  if (p.dp <= 1) return d;
  const ModelLayout& lay = *p.layout;
  const std::vector<int>& idx = lay.stage_params(s.stage);
  const std::vector<ops::TensorDesc> shards = lay.rank_params(s.stage, 0);
  const std::vector<double> ready = grad_ready_times(c, s);
  const int64_t zero = p.recipe.parallel.zero;
  const bool zero1 = zero >= 1;
  const double cap = std::max(1.0, p.recipe.parallel.bucket_mb * 1024.0 * 1024.0 / gbytes);
  double len = 0, at = 0, link_free = 0, gather = 0;
  auto close = [&] {
    if (len <= 0) return;
    len = std::ceil(len / static_cast<double>(p.dp)) * static_cast<double>(p.dp);
    const double t = c.coll(zero1 ? Collective::reduce_scatter : Collective::all_reduce, p.dp, len * gbytes, inter);
    link_free = std::max(link_free, at) + t;
    d.total += t;
    if (zero1 && zero <= 2) gather += c.coll(Collective::all_gather, p.dp, len * wbytes, inter);
    ++d.buckets;
    len = at = 0;
  };
  for (size_t k = idx.size(); k-- > 0;) {
    if (lay.params()[static_cast<size_t>(idx[k])].tied()) continue;
    len += static_cast<double>(ops::numel_of(shards[k].shape));
    at = std::max(at, ready[k]);
    if (len >= cap) close();
  }
  close();
  const double backward = s.chunks.empty() ? 0 : std::accumulate(s.chunks.begin(), s.chunks.end(), 0.0,
      [](double a, const ChunkCost* k) { return a + (k->bwd_end.empty() ? 0 : k->bwd_end.front()); });
  const double times = zero >= 2 ? static_cast<double>(p.accum) : 1.0;
  d.exposed = times * std::max(0.0, link_free - backward) + gather;
  d.total = times * d.total + gather;
  return d;
}

// ZeRO-3's parameter all-gathers on the critical stage, per micro-batch: the gather units
// (each transformer layer's parameters together, the parameters before and after the layers
// one unit each: the ledger's), in the compute dtype, in forward order before the forward and
// in reverse before the backward (not with reshard_after_forward false: the forward's stay),
// over the dp axis only (a tp or pp rank gathers its own shard). Unit i+1's gather
// runs behind unit i's compute (prefetch): exposed is the first unit's gather and, for each
// later unit, what of its gather its predecessor's compute does not cover. The units outside
// the layers (embedding; final norm and head) are priced with no compute to hide behind.
DpCost zero3_gathers(const Ctx& c, const StageCost& s, bool inter, double wbytes) {
  DpCost d;
  const Plan& p = c.p;
  if (p.dp <= 1 || p.recipe.parallel.zero < 3) return d;
  std::vector<double> gather, fwd, bwd;
  int last = -2;
  for (const ops::TensorDesc& t : p.layout->rank_params(s.stage, 0)) {
    const double bytes = static_cast<double>(ops::numel_of(t.shape)) * wbytes;
    if (t.layer == last) { gather.back() += bytes; continue; }
    gather.push_back(bytes), fwd.push_back(0), bwd.push_back(0);
    last = t.layer;
    for (const ChunkCost* k : s.chunks)
      if (auto it = k->layer.find(t.layer); t.layer >= 0 && it != k->layer.end())
        fwd.back() += it->second.first, bwd.back() += it->second.second;
  }
  for (double& g : gather) g = c.coll(Collective::all_gather, p.dp, g, inter);
  const size_t n = gather.size();
  double total = 0, exposed = 0;
  for (size_t i = 0; i < n; ++i) {
    total += gather[i];
    exposed += i == 0 ? gather[i] : std::max(0.0, gather[i] - fwd[i - 1]);
  }
  if (p.recipe.parallel.reshard_after_forward)
    for (size_t i = n; i-- > 0;) {
      total += gather[i];
      exposed += i == n - 1 ? gather[i] : std::max(0.0, gather[i] - bwd[i + 1]);
    }
  const double m = static_cast<double>(p.accum);
  d.total = m * total;
  d.exposed = m * exposed;
  return d;
}

// AdamW over the parameters this rank updates (all of its stage's, or its ZeRO-1 piece of
// each), one fused memory-bound pass: reads the gradient, the moments (and the fp32 master),
// writes the moments and the weights (the 16-bit cast of the master is this write) and
// (Backend::adamw_update_zero_grad) the gradient's zeros for the next step, written back from
// the cache in the same pass. Before it the gradient-norm pass reads
// the gradients it counts. A separate zeroing pass remains only for the gradient elements the
// update does not visit (outside this rank's ZeRO-1 pieces). Same bytes as before the fusion
// (the zeros' write moved from the "zero" pass into "adamw"), one pass and its calls fewer.
double optimizer_seconds(const Ctx& c, const StageCost& s, double gbytes, double wbytes) {
  const Plan& p = c.p;
  const PrecisionConfig& pr = p.recipe.precision;
  const bool master = pr.compute != FloatFormat::fp32 && pr.master_weights == MasterWeights::fp32;
  const ModelLayout& lay = *p.layout;
  const std::vector<ops::TensorDesc> shards = lay.rank_params(s.stage, 0);
  double all = 0, owned = 0;
  size_t split = 0;  // tensors with a ZeRO-1 piece: their rest is zeroed apart
  for (size_t k = 0; k < shards.size(); ++k) {
    const double n = static_cast<double>(ops::numel_of(shards[k].shape));
    const bool sharded = p.recipe.parallel.zero >= 1 && p.dp > 1 && !lay.params()[static_cast<size_t>(lay.stage_params(s.stage)[k])].tied();
    all += n;
    owned += sharded ? n / static_cast<double>(p.dp) : n;
    split += sharded;
  }
  const double per_elem = 2.0 * gbytes + 16.0 + (master ? 8.0 + wbytes : 2.0 * wbytes);
  // Per parameter tensor one call of the norm and one of the fused update, and for a split one
  // zeroing call (op_seconds counts one of each kind).
  const double n = static_cast<double>(std::max<size_t>(1, shards.size()));
  const double calls = c.launch() * (2.0 * (n - 1) + static_cast<double>(split > 1 ? split - 1 : 0));
  const double rest = all > owned ? c.op("zero", (all - owned) * gbytes) : 0.0;
  return c.op("adamw", owned * per_elem) + c.op("sum_squares", owned * gbytes) + rest + calls;
}

// Tensor-parallel collectives outside the passes, once per step on the last micro-batch's
// backward: sequence parallelism's partial gradients (norms, row-parallel biases) summed over tp.
double tp_grad_sums(const Ctx& c, const StageCost& s, double gbytes) {
  if (c.p.tp <= 1) return 0;
  double t = 0;
  for (const ops::TensorDesc& d : c.p.layout->rank_params(s.stage, 0))
    if (d.seq_partial) t += c.tp(Collective::all_reduce, static_cast<double>(ops::numel_of(d.shape)) * gbytes);
  return t;
}

// The tied embedding under pp: its gradient summed over the first and last stage, then over dp
// (after finish_grads: exposed). Returns {pp seconds, dp seconds}.
std::pair<double, double> tied_sums(const Ctx& c, const StageCost& s, double gbytes, bool pp_inter, bool dp_inter) {
  const ModelLayout& lay = *c.p.layout;
  if (lay.pp() <= 1) return {0, 0};
  const std::vector<ops::TensorDesc> shards = lay.rank_params(s.stage, 0);
  const std::vector<int>& idx = lay.stage_params(s.stage);
  for (size_t k = 0; k < idx.size(); ++k) {
    if (!lay.params()[static_cast<size_t>(idx[k])].tied()) continue;
    const double bytes = static_cast<double>(ops::numel_of(shards[k].shape)) * gbytes;
    return {c.coll(Collective::all_reduce, 2, bytes, pp_inter), c.coll(Collective::all_reduce, c.p.dp, bytes, dp_inter)};
  }
  return {0, 0};
}

}  // namespace

int threads_per_rank(const Plan& p, const HardwareProfile& hw) {
  if (!device_kind(p.recipe.hardware).host) return 0;
  if (p.recipe.train.threads > 0) return static_cast<int>(p.recipe.train.threads);
  if (const char* e = std::getenv("OMP_NUM_THREADS"); e && std::atoi(e) > 0) return std::atoi(e);
  const int cores = hw.cores > 0 ? hw.cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t local = std::min<int64_t>(p.world, ranks_per_node(p, hw));
  return std::max(1, static_cast<int>(cores / std::max<int64_t>(1, local)));
}

}  // namespace runner

namespace runner {

namespace {

// step_s and the rates from the breakdown.
void finish(const Plan& p, const HardwareProfile& hw, StepCost& sc) {
  sc.step_s = sc.compute + sc.recompute + sc.bubble + sc.optimizer + sc.data + sc.comm_exposed_s();
  if (sc.step_s <= 0) return;
  const double tokens = static_cast<double>(p.tokens_per_step);
  sc.tokens_per_s = tokens / sc.step_s;
  const double per_device = p.flops_per_token * tokens / static_cast<double>(std::max<int64_t>(1, p.world)) / sc.step_s;
  sc.tflops_per_device = per_device / 1e12;
  double peak = p.recipe.hardware.peak_tflops > 0 ? p.recipe.hardware.peak_tflops * 1e12 : hw.peak_flops(p.recipe.precision.compute);
  if (peak <= 0) peak = p.peak_flops;
  sc.mfu = peak > 0 ? per_device / peak : 0;
}

// The pricing context of a plan: threads, dtype, the host's oversubscription, whether tp
// crosses nodes.
void set_up(Ctx& c, int64_t node) {
  const Plan& p = c.p;
  c.host = device_kind(p.recipe.hardware).host;
  if (c.host && c.hw.cores > 0) {
    const double busy = static_cast<double>(std::min<int64_t>(p.world, node)) * std::max(1, c.threads);
    c.oversubscribed = std::max(1.0, busy / c.hw.cores);
  }
  c.tp_inter = p.tp > 1 && crosses_nodes(p, node, 't');
}

}  // namespace

std::vector<LayerSeconds> layer_seconds(const Plan& p, const HardwareProfile& hw) {
  RUNNER_CHECK(p.layout != nullptr, "layer_seconds needs the plan's layout (make_plan)");
  Ctx c{p, hw, threads_per_rank(p, hw), to_string(p.recipe.precision.compute)};
  set_up(c, ranks_per_node(p, hw));
  std::vector<LayerSeconds> out(static_cast<size_t>(p.recipe.model.n_layers));
  const ModelLayout& lay = *p.layout;
  for (int v = 0; v < lay.vstages(); ++v) {
    const ops::Graph& g = lay.graph(v);
    for (const ops::Node& n : g.nodes) {  // as chunk_cost prices them
      if (n.layer < 0 || n.layer >= p.recipe.model.n_layers) continue;
      const NodeCost nc = node_cost(c, g, n);
      LayerSeconds& l = out[static_cast<size_t>(n.layer)];
      l.pass += nc.fwd + nc.bwd + nc.tp_fwd + nc.tp_bwd;
      if (n.recompute) l.recompute += nc.fwd + nc.tp_fwd;
    }
  }
  return out;
}

StepCost predict_step(const Plan& p, const HardwareProfile& hw) {
  RUNNER_CHECK(p.layout != nullptr, "predict_step needs the plan's layout (make_plan)");
  StepCost sc;
  sc.threads = threads_per_rank(p, hw);
  Ctx c{p, hw, sc.threads, to_string(p.recipe.precision.compute)};
  const int64_t node = ranks_per_node(p, hw);
  set_up(c, node);
  const bool dp_inter = p.dp > 1 && crosses_nodes(p, node, 'd'), pp_inter = p.pp > 1 && crosses_nodes(p, node, 'p');
  const ModelLayout& lay = *p.layout;
  const int P = lay.pp();
  std::vector<ChunkCost> chunks;
  for (int v = 0; v < lay.vstages(); ++v) chunks.push_back(chunk_cost(c, v));
  StageCost s = stage_cost(chunks, 0, P);  // the slowest stage sets the pace
  double all_stages = s.f + s.b;            // one micro-batch through every stage
  for (int st = 1; st < P; ++st) {
    StageCost o = stage_cost(chunks, st, P);
    all_stages += o.f + o.b;
    if (o.f + o.b > s.f + s.b) s = std::move(o);
  }
  const double m = static_cast<double>(p.accum);
  const double wbytes = static_cast<double>(plan_detail::dtype_bytes(to_string(p.recipe.precision.compute)));
  const double gbytes = p.recipe.precision.compute == FloatFormat::fp32
                            ? 4.0 : static_cast<double>(plan_detail::dtype_bytes(to_string(p.recipe.precision.grad_accum)));
  sc.compute = m * (s.fwd + s.bwd);
  sc.recompute = m * s.rec;
  // The slowest stage runs its m micro-batches back to back once the pipeline is full; it
  // waits for the other stages' forwards of the first micro-batch (fill) and their backwards of
  // the last (drain): the other p-1 stages' forward + backward of one micro-batch, 1/v of it
  // under the interleaved schedule (chunks of 1/v the size). With equal stages that is
  // (p-1)/v of the slowest stage's, so the bubble's share is plan.bubble, (p-1)/(v*m + p-1).
  sc.bubble = (all_stages - (s.f + s.b)) / static_cast<double>(lay.chunks());
  const double sp_sums = tp_grad_sums(c, s, gbytes);
  sc.comm_total["tp"] = sc.comm_exposed["tp"] = m * s.tp + sp_sums;
  const auto [tied_pp, tied_dp] = tied_sums(c, s, gbytes, pp_inter, dp_inter);
  sc.comm_total["pp"] = m * s.pp_total + tied_pp;
  sc.comm_exposed["pp"] = m * s.pp + tied_pp;
  DpCost d = dp_cost(c, s, dp_inter, gbytes, wbytes);
  const DpCost g3 = zero3_gathers(c, s, dp_inter, wbytes);
  d.total += g3.total;
  d.exposed += g3.exposed;
  // The step's small all-reduces: the target-token count over dp, and the gradient norm over
  // the world (counted with the first group there is: dp, else tp, else pp).
  const double count = c.coll(Collective::all_reduce, p.dp, 8, dp_inter);
  const double norm = c.coll(Collective::all_reduce, p.world, 16, p.world > node);
  const char* norm_group = p.dp > 1 ? "dp" : p.tp > 1 ? "tp" : "pp";
  sc.comm_total["dp"] = d.total + tied_dp + count;
  sc.comm_exposed["dp"] = d.exposed + tied_dp + count;
  sc.comm_total[norm_group] += norm;
  sc.comm_exposed[norm_group] += norm;
  sc.optimizer = optimizer_seconds(c, s, gbytes, wbytes);
  // Batches come from the loader's threads, data.prefetch (at least 1) batches ahead: their
  // reading and batching is hidden; nothing of it is on the critical path.
  sc.data = 0;
  finish(p, hw, sc);
  return sc;
}

}  // namespace runner
