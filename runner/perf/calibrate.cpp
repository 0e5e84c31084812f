// `runner calibrate` (calibrate.h): one-node graphs through ops' Executor for the compute
// figures, the Communicator's tensor calls for the collectives.
#include "runner/perf/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <functional>
#include <memory>
#include <thread>

#include <fmt/format.h>

#include "ops/executor.h"
#include "ops/gemm_path.h"
#include "ops/group.h"
#include "ops/node_graph.h"
#include "ops/ops.h"
#include "ops/peak.h"
#include "runner/device/device.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#include "runner/perf/peak.h"

namespace runner {

namespace {

using Clock = std::chrono::steady_clock;
using ops::DType;
using ops::OpKind;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

DType dtype_of(const std::string& s) { return s == "bf16" ? DType::BF16 : s == "fp16" ? DType::F16 : DType::F32; }

// Measurements are split in chunks and the best kept: on a shared machine a neighbour's burst
// spoils a chunk, rarely all of them.
constexpr int kChunks = 5;

struct NodeTimes {
  double forward_s = 0, backward_s = 0;
};

// Runs the node's forward + backward through an Executor until `target_s` has passed (at least
// twice after a warm-up), in kChunks chunks, and returns the best chunk's per-call times (the
// executor's own per-kind timing, device timers on a GPU).
NodeTimes time_node(const ops::Graph& g, ops::Backend& be, double target_s) {
  ops::SoloGroup group;  // no tensor-parallel nodes here; the executor wants a group all the same
  ops::Executor ex(g, be);
  ex.set_group(&group);
  std::vector<ops::Tensor> values, grads;
  values.reserve(g.params.size());
  grads.reserve(g.params.size());
  for (int id : g.params) {
    const ops::TensorDesc& d = g.tensors[id];
    values.emplace_back(d.shape, d.dtype, ops::Account::Parameters, true);
    grads.emplace_back(d.shape, d.grad_dtype, ops::Account::Gradients, true);
    ex.bind_param(id, &values.back(), &grads.back());
  }
  const size_t rows = static_cast<size_t>(g.B * g.T);
  std::vector<int32_t> tok(rows, 1), tgt(rows, 1);
  auto like = [](const ops::TensorDesc& d) { return ops::Tensor(d.shape, d.dtype, ops::Account::Activations, true); };
  ops::Tensor sin, dsin, sout, dsout;  // the stage buffers (unused: raw() is null)
  if (g.stage_input >= 0) sin = like(g.tensors[g.stage_input]), dsin = like(g.tensors[g.stage_input]);
  if (g.stage_output >= 0) sout = like(g.tensors[g.stage_output]), dsout = like(g.tensors[g.stage_output]);
  auto step = [&] {
    ex.forward(g.tokens >= 0 ? tok.data() : nullptr, g.targets >= 0 ? tgt.data() : nullptr, true, 1, 0, sin.raw(),
               sout.raw());
    ex.backward(1.0f, dsout.raw(), dsin.raw());
  };
  step();  // warm-up: first-touch of buffers, kernel selection
  be.synchronize();
  NodeTimes best{1e30, 1e30};
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    ex.reset_profile();
    const Clock::time_point t0 = Clock::now();
    int calls = 0;
    do {
      step();
      ++calls;
      if (calls % 4 == 0) be.synchronize();
    } while (calls < 2 || seconds_since(t0) < target_s / kChunks);
    be.synchronize();
    for (const ops::OpProfile& p : ex.profile())
      if (p.name == ops::op_name(g.nodes[0].kind) && p.calls > 0) {
        best.forward_s = std::min(best.forward_s, p.forward_ms * 1e-3 / p.calls);
        best.backward_s = std::min(best.backward_s, p.backward_ms * 1e-3 / p.calls);
      }
  }
  return best;
}

// ---- compute --------------------------------------------------------------------------------

struct Plan {
  std::vector<std::array<int64_t, 3>> gemm;           // (m, n, k)
  std::vector<std::pair<int64_t, int64_t>> attention;  // (seq, head_dim)
  std::vector<std::string> dtypes;
  int64_t op_rows = 0, op_cols = 0;  // the memory-bound ops' (rows, features)
  double target_s = 0;               // per measurement
};

// The shapes transformer layers make: square GEMMs 64..2048 (past 2048 the rate is flat on a
// CPU and the grid's edge clamps), and (tokens x d_model) by the qkv, MLP and projection
// widths of a 768-wide model at 256..4096 tokens.
Plan measurement_plan(bool quick) {
  Plan p;
  if (quick) {
    p.gemm = {{64, 64, 64}, {256, 256, 256}, {512, 768, 768}};
    p.attention = {{128, 64}};
    p.dtypes = {"fp32", "bf16"};
    p.op_rows = 256, p.op_cols = 256;
    p.target_s = 0.01;
    return p;
  }
  for (int64_t s : {64, 128, 256, 512, 1024, 2048}) p.gemm.push_back({s, s, s});
  for (int64_t m : {256, 1024, 4096})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {3072, 768}, {768, 3072}, {768, 768}})
      p.gemm.push_back({m, n, k});
  p.attention = {{128, 64}, {512, 64}, {1024, 64}, {512, 128}};
  p.dtypes = {"fp32", "bf16", "fp16"};
  p.op_rows = 4096, p.op_cols = 1024;
  p.target_s = 0.1;
  return p;
}

// Each Linear (rows m, k -> n features) runs three GEMMs: the forward (m, n, k) and, in its
// backward, d(input) (m, k, n) and d(weight) (n, k, m), timed together (their mean rate is
// recorded at both shapes). A shape met more than once (a square, or one Linear's backward
// shape that is another's forward) gets the rate of its calls together: count / sum(1 / rate).
// So the profile holds what the runner's forward and backward GEMMs run at, shape by shape.
void measure_gemms(ComputeProfile& c, const Plan& plan, ops::Backend& be, const CalibrateOptions& o) {
  for (const std::string& dt : plan.dtypes) {
    std::map<std::array<int64_t, 3>, std::pair<double, int>> per_flop;  // shape -> (sum 1/rate, calls)
    int i = 0;
    for (const auto& [m, n, k] : plan.gemm) {
      if (o.progress)
        o.progress(fmt::format("gemm {} {} threads: {}/{} ({}x{}x{})", dt, c.threads, ++i, plan.gemm.size(), m, n, k));
      const DType act = dtype_of(dt);
      ops::NodeGraph ng(OpKind::Linear, 1, m);
      ng.x({m, k}, act).param("W", {n, k}, act).out("y", {m, n}, act).done();
      const NodeTimes t = time_node(ng.g, be, plan.target_s);
      const double flops = ops::op_def(ng.g.nodes[0].kind).flops(ng.g, ng.g.nodes[0], false);  // 2mnk
      for (auto [shape, s_per_flop] : {std::pair{std::array{m, n, k}, t.forward_s / flops},
                                       {std::array{m, k, n}, t.backward_s / (2 * flops)},
                                       {std::array{n, k, m}, t.backward_s / (2 * flops)}}) {
        per_flop[shape].first += s_per_flop;
        per_flop[shape].second += 1;
      }
    }
    for (const auto& [shape, acc] : per_flop) c.gemm[dt].push_back({shape[0], shape[1], shape[2], acc.second / acc.first});
  }
}

void measure_attention(ComputeProfile& c, const Plan& plan, ops::Backend& be, const CalibrateOptions& o) {
  constexpr int64_t kHeads = 4;
  for (const std::string& dt : plan.dtypes)
    for (const auto& [T, hd] : plan.attention) {
      if (o.progress) o.progress(fmt::format("attention {} {} threads: seq {} head_dim {}", dt, c.threads, T, hd));
      const int64_t C = kHeads * hd;
      const DType act = dtype_of(dt);
      ops::NodeGraph ng(OpKind::Attention, 1, T);
      ng.x({T, 3 * C}, act).out("y", {T, C}, act).out("lse", {1, kHeads, T}, DType::F32);
      ng.n.heads = static_cast<int>(kHeads);
      ng.done();
      const NodeTimes t = time_node(ng.g, be, plan.target_s);
      const double fwd = 2.0 * kHeads * T * T * hd;  // the causal kernel's matmul work (profile.h)
      c.attention[dt].push_back({T, hd, fwd / t.forward_s, 2 * fwd / t.backward_s});
    }
}

// Each memory-bound kind with a probe (OpDef::probe), at (N rows, C features) in fp32: its
// bandwidth is the bytes its forward and backward move (OpDef::traffic, the units the cost
// model prices them in) over their measured time.
void measure_ops(ComputeProfile& c, const Plan& plan, ops::Backend& be, const CalibrateOptions& o) {
  const int64_t N = plan.op_rows, C = plan.op_cols;
  for (const ops::OpDef* op : ops::kOpTable) {
    if (!op->probe || !op->traffic) continue;
    if (o.progress) o.progress(fmt::format("op {} {} threads ({} x {})", op->name, c.threads, N, C));
    ops::NodeGraph ng(op->kind, 1, N);
    ops::NodeGraphProbe probe(ng, DType::F32);
    op->probe(probe, N, C);
    ng.done();
    const ops::OpTrafficParts t = op->traffic(ng.g, ng.g.nodes[0]);
    double bytes = 0;
    for (int i = 0; i < t.count; ++i) {
      const ops::OpTraffic& part = t.parts[static_cast<size_t>(i)];
      if (part.kind && std::string(part.kind) == op->name) bytes += part.forward + part.backward;
    }
    const NodeTimes tm = time_node(ng.g, be, plan.target_s);
    c.op_bandwidth[op->name] = bytes / (tm.forward_s + tm.backward_s);
  }
}

// Bytes/s of a backend call that moves `bytes` (best chunk), `call(i)` being its i-th call.
double measure_call(ops::Backend& be, double bytes, double target_s, const std::function<void(int64_t)>& call) {
  call(1);
  be.synchronize();
  double best = 1e30;
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    const Clock::time_point t0 = Clock::now();
    int calls = 0;
    do call(2 + calls++);
    while (calls < 2 || seconds_since(t0) < target_s / kChunks);
    be.synchronize();
    best = std::min(best, seconds_since(t0) / calls);
  }
  return bytes / best;
}

// The optimizer step's backend calls over n fp32 elements, as the runner makes them: AdamW
// (reads param, grad, m, v; writes param, m, v: 28 bytes an element), the gradient norm's sum
// of squares (reads 4) and the gradients' zeroing (writes 4).
void measure_optimizer(ComputeProfile& c, ops::Backend& be, int64_t n, double target_s) {
  std::vector<ops::Tensor> t;
  for (int i = 0; i < 4; ++i) t.emplace_back(std::vector<int64_t>{n}, DType::F32, ops::Account::Optimizer, true);
  float* p[4] = {t[0].data<float>(), t[1].data<float>(), t[2].data<float>(), t[3].data<float>()};
  c.op_bandwidth["adamw"] = measure_call(be, 28.0 * n, target_s, [&](int64_t it) {
    be.run(ops::k::AdamwUpdate(p[0], p[1], p[2], p[3], n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, it, 1.0f));
  });
  volatile double sink = 0;
  c.op_bandwidth["sum_squares"] = measure_call(be, 4.0 * n, target_s, [&](int64_t) { sink = sink + ops::sum_squares(be, p[1], n); });
  c.op_bandwidth["zero"] = measure_call(be, 4.0 * n, target_s, [&](int64_t) { be.run(ops::k::Fill(p[1], DType::F32, 0.0f, n)); });
}

// A kernel call's fixed cost: an 8-element Add's forward + backward, halved.
double measure_launch(ops::Backend& be, double target_s) {
  ops::NodeGraph ng(OpKind::Add, 1, 1);
  ng.x({1, 8}, DType::F32).param("b", {1, 8}, DType::F32).out("y", {1, 8}, DType::F32).done();
  const NodeTimes t = time_node(ng.g, be, target_s);
  return (t.forward_s + t.backward_s) / 2;
}

ComputeProfile measure_compute(int threads, bool cpu, const Plan& plan, ops::Backend& be, const CalibrateOptions& o) {
  ComputeProfile c;
  c.threads = cpu ? threads : 0;
  if (cpu) ops::set_num_threads(threads);
  measure_gemms(c, plan, be, o);
  measure_attention(c, plan, be, o);
  measure_ops(c, plan, be, o);
  if (o.progress) o.progress(fmt::format("optimizer (adamw, sum_squares, zero), launch, memory bandwidth {} threads", c.threads));
  measure_optimizer(c, be, plan.op_rows * plan.op_cols, plan.target_s);
  c.launch_s = measure_launch(be, plan.target_s);
  c.memory_bandwidth = cpu ? ops::measure_cpu_memory_bandwidth() : c.op_bandwidth.at("add");
  return c;
}

// ---- collectives ----------------------------------------------------------------------------

// The slowest member's mean time of `reps` calls (after a warm-up), every member timing the
// same, best of three chunks: on an oversubscribed machine one time slice lost to a neighbour
// (tens of milliseconds) would otherwise pass for a small message's latency.
double time_calls(parallel::Communicator& c, int reps, const std::function<void()>& call) {
  c.barrier();
  call();
  double best = 1e30;
  for (int chunk = 0; chunk < 3; ++chunk) {
    c.barrier();
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < reps; ++i) call();
    int64_t ns = static_cast<int64_t>(seconds_since(t0) / reps * 1e9);
    c.allreduce_max(&ns, 1);
    best = std::min(best, double(ns) * 1e-9);
  }
  return best;
}

}  // namespace

std::pair<double, double> fit_latency_bandwidth(const std::vector<std::pair<double, double>>& pts) {
  double sw = 0, sx = 0, sxx = 0, st = 0, sxt = 0;
  for (auto [x, t] : pts) {
    const double w = 1.0 / (t * t);
    sw += w, sx += w * x, sxx += w * x * x, st += w * t, sxt += w * x * t;
  }
  double b = (sw * sxt - sx * st) / (sw * sxx - sx * sx), a = (st - b * sx) / sw;
  if (a < 0) a = 0, b = sxt / sxx;
  if (!(b > 0)) b = pts.back().second / pts.back().first;  // flat in size: the largest message's rate
  return {a, 1.0 / b};
}

namespace {

std::vector<double> message_sizes(bool quick) {
  if (quick) return {4096, 65536, 1 << 20};
  std::vector<double> v;
  for (double s = 4096; s <= 64.0 * (1 << 20); s *= 4) v.push_back(s);
  return v;
}

// Calls per chunk (time_calls runs three): enough to average a small message's jitter.
int reps_for(double bytes, bool quick) { return bytes <= 65536 ? (quick ? 5 : 15) : bytes <= (1 << 20) ? 4 : 2; }

// The four collectives over `c` (g members) through its tensor calls (broadcast: the host call,
// as the runner broadcasts only host buffers).
std::vector<CollectiveFit> measure_group(parallel::Communicator& c, bool inter, bool quick, const CalibrateOptions& o) {
  const int g = c.size();
  const std::vector<double> sizes = message_sizes(quick);
  const int64_t most = int64_t(sizes.back() / 4);
  ops::Tensor buf({most}, DType::F32, ops::Account::Communication, true), out({most}, DType::F32,
                                                                            ops::Account::Communication, true);
  std::vector<char> host(size_t(sizes.back()));
  parallel::TensorComm& tc = c.tensors();
  std::vector<CollectiveFit> fits;
  for (Collective op : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter, Collective::broadcast}) {
    if (o.progress && c.rank() == 0)
      o.progress(fmt::format("{} over {} ranks{}", to_string(op), g, inter ? " (inter-node)" : ""));
    std::vector<std::pair<double, double>> pts;
    for (double bytes : sizes) {
      // Elements: each rank's shard, and the full buffer (profile.h's `bytes` is the full one).
      const int64_t shard = std::max<int64_t>(1, int64_t(bytes / 4) / g);
      const int64_t n = op == Collective::all_reduce ? int64_t(bytes / 4) : shard * g;
      auto call = [&] {
        switch (op) {
          case Collective::all_reduce: tc.iallreduce_sum(buf.raw(), DType::F32, n)->wait(); break;
          case Collective::all_gather: tc.iallgather_inplace(buf.raw(), DType::F32, shard)->wait(); break;
          case Collective::reduce_scatter: tc.ireduce_scatter_sum(buf.raw(), out.raw(), DType::F32, shard)->wait(); break;
          default: c.broadcast(host.data(), size_t(n * 4), 0);
        }
      };
      pts.emplace_back(double(n * 4), time_calls(c, reps_for(bytes, quick), call));
    }
    const auto [a, bw] = fit_latency_bandwidth(pts);
    fits.push_back({op, g, inter, a, bw});
  }
  return fits;
}

int64_t host_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return static_cast<int64_t>(std::hash<std::string>{}(name) >> 1);
}

// Half a ping-pong between ranks 0 and 1 of `world`, per message size.
CollectiveFit measure_send_recv(parallel::Communicator& w, bool quick, const CalibrateOptions& o) {
  int64_t h0 = host_hash(), h1 = h0;
  w.broadcast(&h0, sizeof h0, 0);
  w.broadcast(&h1, sizeof h1, 1);
  const std::vector<double> sizes = message_sizes(quick);
  ops::Tensor buf({int64_t(sizes.back() / 4)}, DType::F32, ops::Account::Communication, true);
  parallel::TensorComm& tc = w.tensors();
  if (o.progress && w.rank() == 0) o.progress("send_recv between ranks 0 and 1");
  std::vector<std::pair<double, double>> pts;
  for (double bytes : sizes) {
    auto call = [&] {
      if (w.rank() == 0) tc.send(buf.raw(), size_t(bytes), 1, 11), tc.recv(buf.raw(), size_t(bytes), 1, 12);
      else if (w.rank() == 1) tc.recv(buf.raw(), size_t(bytes), 0, 11), tc.send(buf.raw(), size_t(bytes), 0, 12);
    };
    pts.emplace_back(bytes, time_calls(w, reps_for(bytes, quick), call) / 2);
  }
  const auto [a, bw] = fit_latency_bandwidth(pts);
  return {Collective::send_recv, 2, h0 != h1, a, bw};
}

std::vector<CollectiveFit> measure_collectives(parallel::Communicator& w, bool quick, const CalibrateOptions& o) {
  std::vector<CollectiveFit> fits;
  const int N = w.size(), r = w.rank();
  for (int g = 2; g <= N; ++g) {
    std::unique_ptr<parallel::Communicator> sub = w.split(r < g ? 0 : 1, r);
    int64_t lo = host_hash(), hi = lo;
    sub->allreduce_min(&lo, 1);
    sub->allreduce_max(&hi, 1);
    if (r < g)
      for (const CollectiveFit& f : measure_group(*sub, lo != hi, quick, o)) fits.push_back(f);
    w.barrier();
  }
  fits.push_back(measure_send_recv(w, quick, o));
  return fits;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// What calibration does not measure: the built-in profile's links (replaced by the measured
// send_recv where there is one) and peaks (raised to the best measured rate, so that measured
// points stay exact under profile.h's peak bound).
HardwareProfile base_profile(const HardwareConfig& hw) {
  try {
    return builtin_profile(hw);
  } catch (const UserError&) {  // cuda / custom: no data sheet; links like an A100 node's
    HardwareProfile p;
    p.intra_node = {3e-6, 225e9};
    p.inter_node = {6e-6, 18.75e9};
    return p;
  }
}

void raise_peaks(HardwareProfile& p) {
  for (const ComputeProfile& c : p.compute)
    for (const auto& [dt, rs] : c.gemm)
      for (const GemmRate& g : rs) {
        double& peak = dt == "fp32" ? p.peak_flops_fp32 : dt == "bf16" ? p.peak_flops_bf16 : p.peak_flops_fp16;
        peak = std::max(peak, g.flops_per_s);
      }
}

// The other ranks wait for rank 0's compute measurements without spinning (a busy MPI wait
// would take the cores rank 0 is measuring).
void wait_for_rank0(parallel::Communicator& w) {
  char done = 0;
  if (w.rank() == 0) {
    for (int r = 1; r < w.size(); ++r) w.send(&done, 1, r, 21);
    return;
  }
  std::unique_ptr<parallel::Request> req = w.irecv(&done, 1, 0, 21);
  while (!req->test()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

std::vector<int> default_thread_counts(int cores) {
  std::vector<int> v;
  for (int t = 1; t < cores; t *= 2) v.push_back(t);
  v.push_back(std::max(cores, 1));
  return v;
}

HardwareProfile calibrate(const CalibrateOptions& o, parallel::Communicator* world) {
  Recipe r;
  r.hardware.device = o.device;
  ops::Backend& be = select_backend(r);
  const bool cpu = device_kind(r.hardware).host;
  HardwareProfile p = base_profile(r.hardware);
  p.device = o.device;
  p.cores = std::max(1, int(std::thread::hardware_concurrency()));
  p.host = cpu ? cpu_model() : fmt::format("{} ({} backend) on {}", o.device, be.name(), cpu_model());
  p.source = fmt::format("runner calibrate{} at {}", o.quick ? " --quick" : "", now_utc());
  p.compute.clear();
  p.collectives.clear();
  if (world && world->size() > 1) {
    p.collectives = measure_collectives(*world, o.quick, o);
    for (const CollectiveFit& f : p.collectives)
      if (f.op == Collective::send_recv) (f.inter_node ? p.inter_node : p.intra_node) = {f.latency_s, f.bandwidth};
  }
  const int rank = world ? world->rank() : 0;
  if (rank == 0) {
    const Plan plan = measurement_plan(o.quick);
    const int before = ops::num_threads();
    for (int t : cpu ? (o.threads.empty() ? default_thread_counts(p.cores) : o.threads) : std::vector<int>{0})
      p.compute.push_back(measure_compute(t, cpu, plan, be, o));
    if (cpu) ops::set_num_threads(before);
    raise_peaks(p);
  }
  if (world && world->size() > 1) wait_for_rank0(*world);
  return p;
}

std::string calibrate_summary(const HardwareProfile& p) {
  std::string s = fmt::format("hardware profile of {} ({}), {}\n", p.device, p.host, p.source);
  for (const ComputeProfile& c : p.compute) {
    const std::string who = c.threads > 0 ? fmt::format("{} thread{}", c.threads, c.threads == 1 ? "" : "s") : "device";
    for (const auto& [dt, rs] : c.gemm) {
      const auto best = std::max_element(rs.begin(), rs.end(), [](auto& a, auto& b) { return a.flops_per_s < b.flops_per_s; });
      if (best != rs.end())
        s += fmt::format("  {:<10} gemm {:<4}: best {:8.1f} GFLOP/s at {}x{}x{}\n", who, dt, best->flops_per_s / 1e9,
                         best->m, best->n, best->k);
    }
    for (const auto& [dt, rs] : c.attention)
      if (!rs.empty())
        s += fmt::format("  {:<10} attention {:<4}: {:.1f} / {:.1f} GFLOP/s forward / backward at seq {} hd {}\n", who,
                         dt, rs.back().forward_flops_per_s / 1e9, rs.back().backward_flops_per_s / 1e9, rs.back().seq,
                         rs.back().head_dim);
    s += fmt::format("  {:<10} memory {:.1f} GB/s, launch {:.1f} us, ops:", who, c.memory_bandwidth / 1e9, c.launch_s * 1e6);
    for (const auto& [op, bw] : c.op_bandwidth) s += fmt::format(" {} {:.1f}", op, bw / 1e9);
    s += " GB/s\n";
  }
  for (const CollectiveFit& f : p.collectives)
    s += fmt::format("  {:<14} {} ranks{}: latency {:.1f} us, bandwidth {:.2f} GB/s\n", to_string(f.op), f.ranks,
                     f.inter_node ? " inter-node" : "", f.latency_s * 1e6, f.bandwidth / 1e9);
  if (p.collectives.empty()) s += "  collectives: not measured (one process; run under mpirun/srun to measure them)\n";
  return s;
}

}  // namespace runner
