// The hardware profile (hardware_profile.h): interpolation of measured rates, the collective model, the
// JSON file `runner calibrate` writes, and the built-in profiles of the device table's kinds.
//
// Interpolation: inverse-distance weighting in log space. A GEMM shape is the point
// (log2 m, log2 n, log2 k), an attention shape (log2 seq, log2 head_dim); the rate at a query is
// the weighted geometric mean of the rates of its nearest measured shapes (weights 1/d^2, over
// the shapes no farther than twice the nearest one's distance, at most 8), so it is exact at a
// measured shape and lies between its neighbours' rates between them. A query outside the grid
// is first clamped onto the grid's bounding box, axis by axis (an 8192^3 GEMM takes the largest
// measured cube's rate: no extrapolation). Two bounds then apply: never faster than the peak,
// and, for a GEMM with a dimension below the grid's smallest, never faster than moving its
// operands through memory (the roofline) -- what keeps a tiny shape from borrowing the smallest
// measured shape's rate.
#include "runner/perf/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/gemm_path.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#include "runner/perf/peak.h"

namespace runner {

namespace {

using ops::DType;
const std::string kCalibrateFix = "run `runner calibrate --out FILE` on the machine and name FILE in hardware.profile "
                                  "(or plan --profile FILE); or remove hardware.profile to use the built-in profile";

double log2d(double x) { return std::log2(std::max(x, 1.0)); }

// Inverse-distance weighting of log(rate) over points in log space (see the file's comment).
// `pts[i]` are coordinates, `rates[i]` > 0.
double idw_log_rate(const std::vector<std::vector<double>>& pts, const std::vector<double>& rates,
                    std::vector<double> q) {
  for (size_t a = 0; a < q.size(); ++a) {  // outside the grid: clamped onto its bounding box
    double lo = pts[0][a], hi = pts[0][a];
    for (const auto& pt : pts) lo = std::min(lo, pt[a]), hi = std::max(hi, pt[a]);
    q[a] = std::clamp(q[a], lo, hi);
  }
  std::vector<std::pair<double, size_t>> d;
  for (size_t i = 0; i < pts.size(); ++i) {
    double s = 0;
    for (size_t a = 0; a < q.size(); ++a) s += (pts[i][a] - q[a]) * (pts[i][a] - q[a]);
    d.emplace_back(std::sqrt(s), i);
  }
  std::sort(d.begin(), d.end());
  if (d.front().first < 1e-9) return rates[d.front().second];
  const double limit = 2 * d.front().first;
  double wsum = 0, lsum = 0;
  for (size_t j = 0; j < d.size() && j < 8 && d[j].first <= limit; ++j) {
    const double w = 1.0 / (d[j].first * d[j].first);
    wsum += w;
    lsum += w * std::log(rates[d[j].second]);
  }
  return std::exp(lsum / wsum);
}

double dtype_bytes(const std::string& dtype) { return dtype == "fp32" ? 4.0 : 2.0; }

double peak_of(const HardwareProfile& p, const std::string& dtype) {
  return dtype == "fp32" ? p.peak_flops_fp32 : dtype == "bf16" ? p.peak_flops_bf16 : p.peak_flops_fp16;
}

// The measured GEMM rates for `dtype`, else fp32's, else null.
const std::vector<GemmRate>* gemm_rates(const ComputeProfile& c, const std::string& dtype) {
  for (const std::string& d : {dtype, std::string("fp32")}) {
    auto it = c.gemm.find(d);
    if (it != c.gemm.end() && !it->second.empty()) return &it->second;
  }
  return nullptr;
}

}  // namespace

const ComputeProfile& HardwareProfile::at_threads(int threads) const {
  RUNNER_CHECK(!compute.empty(), "hardware profile without compute entries");
  const ComputeProfile* best = &compute.front();
  for (const ComputeProfile& c : compute) {
    if (threads <= 0) {  // unspecified: the whole machine, the most threads measured
      if (c.threads > best->threads) best = &c;
      continue;
    }
    const double dc = std::abs(std::log(std::max(c.threads, 1)) - std::log(threads));
    const double db = std::abs(std::log(std::max(best->threads, 1)) - std::log(threads));
    if (dc < db || (dc == db && c.threads < best->threads)) best = &c;
  }
  return *best;
}

double HardwareProfile::gemm_seconds(const std::string& dtype, int64_t m, int64_t n, int64_t k, int threads) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const ComputeProfile& c = at_threads(threads);
  const double flops = 2.0 * double(m) * double(n) * double(k);
  double rate = peak_of(*this, dtype);
  bool below_grid = true;  // no measured shape: only the peak and the roofline know anything
  if (const std::vector<GemmRate>* rs = gemm_rates(c, dtype)) {
    std::vector<std::vector<double>> pts;
    std::vector<double> rates;
    int64_t lo[3] = {rs->front().m, rs->front().n, rs->front().k};
    for (const GemmRate& g : *rs) {
      pts.push_back({log2d(g.m), log2d(g.n), log2d(g.k)});
      rates.push_back(g.flops_per_s);
      lo[0] = std::min(lo[0], g.m), lo[1] = std::min(lo[1], g.n), lo[2] = std::min(lo[2], g.k);
    }
    const double r = idw_log_rate(pts, rates, {log2d(m), log2d(n), log2d(k)});
    rate = rate > 0 ? std::min(rate, r) : r;
    below_grid = m < lo[0] || n < lo[1] || k < lo[2];
  }
  RUNNER_CHECK(rate > 0, "hardware profile " + source + " knows no GEMM rate or peak for " + dtype);
  // The roofline only below the grid: inside it the measurements already include the memory
  // traffic (and a small GEMM's operands may sit in cache, faster than memory_bandwidth).
  const double bytes = dtype_bytes(dtype) * (double(m) * k + double(k) * n + double(m) * n);
  const double roofline = below_grid && c.memory_bandwidth > 0 ? bytes / c.memory_bandwidth : 0;
  return std::max(flops / rate, roofline);
}

double HardwareProfile::op_seconds(const std::string& op, double bytes, int threads) const {
  const ComputeProfile& c = at_threads(threads);
  auto it = c.op_bandwidth.find(op);
  const double bw = it != c.op_bandwidth.end() && it->second > 0 ? it->second : c.memory_bandwidth;
  return (bw > 0 ? bytes / bw : 0) + c.launch_s;
}

double HardwareProfile::attention_seconds(const std::string& dtype, int64_t batch_heads, int64_t seq, int64_t head_dim,
                                          bool backward, int threads) const {
  if (batch_heads <= 0 || seq <= 0 || head_dim <= 0) return 0;
  // The matmul work of the causal kernel: QK^T and PV, 2 * 2*T*T*hd, half of it masked away.
  const double fwd = 2.0 * double(batch_heads) * double(seq) * double(seq) * double(head_dim);
  const double flops = backward ? 2 * fwd : fwd;
  const ComputeProfile& c = at_threads(threads);
  const std::vector<AttentionRate>* rs = nullptr;
  for (const std::string& d : {dtype, std::string("fp32")}) {
    auto it = c.attention.find(d);
    if (it != c.attention.end() && !it->second.empty()) { rs = &it->second; break; }
  }
  if (!rs) {  // not measured: the GEMM of its scores' shape, twice for the backward
    const double t = gemm_seconds(dtype, seq, seq, head_dim, threads) * double(batch_heads);
    return backward ? 2 * t : t;
  }
  std::vector<std::vector<double>> pts;
  std::vector<double> rates;
  for (const AttentionRate& a : *rs) {
    pts.push_back({log2d(a.seq), log2d(a.head_dim)});
    rates.push_back(backward ? a.backward_flops_per_s : a.forward_flops_per_s);
  }
  double rate = idw_log_rate(pts, rates, {log2d(seq), log2d(head_dim)});
  const double peak = peak_of(*this, dtype);
  if (peak > 0) rate = std::min(rate, peak);
  return flops / rate;
}

namespace {

// The link model of hardware_profile.h: `bytes` is the full buffer (see collective_seconds there).
double link_seconds(Collective op, int n, double bytes, const Link& l) {
  const double bw = l.bandwidth > 0 ? l.bandwidth : std::numeric_limits<double>::infinity();
  const double a = l.latency_s, f = double(n - 1) / n, steps = std::ceil(std::log2(double(n)));
  switch (op) {
    case Collective::all_reduce: {
      const double ring = 2 * f * bytes / bw + 2 * (n - 1) * a;
      const double tree = 2 * steps * (a + bytes / bw);
      return std::min(ring, tree);
    }
    case Collective::all_gather:
    case Collective::reduce_scatter: return f * bytes / bw + (n - 1) * a;
    case Collective::broadcast: return std::min(steps * (a + bytes / bw), bytes / bw + (n - 1) * a);
    case Collective::send_recv: return a + bytes / bw;
  }
  return 0;
}

}  // namespace

double HardwareProfile::collective_seconds(Collective op, int ranks, double bytes, bool inter_node) const {
  if (op != Collective::send_recv && ranks <= 1) return 0;
  const int n = std::max(ranks, 2);
  // A measured fit at this level: the exact group size, else the nearest, its latency term
  // scaled by the ring's step count (n-1) and its bandwidth term by the ring's (n-1)/n.
  const CollectiveFit* best = nullptr;
  for (const CollectiveFit& f : collectives) {
    if (f.op != op || f.inter_node != inter_node || f.bandwidth <= 0) continue;
    if (op == Collective::send_recv) { best = &f; break; }  // point to point: no group size
    if (!best || std::abs(f.ranks - n) < std::abs(best->ranks - n) ||
        (std::abs(f.ranks - n) == std::abs(best->ranks - n) && f.ranks > best->ranks))
      best = &f;
  }
  if (best) {
    if (op == Collective::send_recv || best->ranks == n) return best->latency_s + bytes / best->bandwidth;
    const int m = std::max(best->ranks, 2);
    const double lat = best->latency_s * double(n - 1) / (m - 1);
    const double bw_scale = (double(n - 1) / n) / (double(m - 1) / m);
    return lat + bw_scale * bytes / best->bandwidth;
  }
  return link_seconds(op, n, bytes, inter_node ? this->inter_node : intra_node);
}

double HardwareProfile::peak_flops(FloatFormat f) const {
  return f == FloatFormat::fp32 ? peak_flops_fp32 : f == FloatFormat::bf16 ? peak_flops_bf16 : peak_flops_fp16;
}


// ---- built-in profiles ---------------------------------------------------------------------

namespace {

// The GPU kinds' figures are the device table's (devices.h, with their sources). A streaming
// kernel achieves ~88% of the data sheet's memory bandwidth, and NCCL's bus bandwidth reaches
// ~75% of a link (nccl-tests on DGX systems). fp32 without TF32 runs on the CUDA cores, which a
// GEMM fills sooner and to ~90%.
constexpr double kAchievedMemory = 0.88, kNcclBus = 0.75;

std::string builtin_fix(const std::string& device) {
  return "name the GPU model in hardware.device (a100-40gb, a100-80gb, h100-80gb, h200, v100-32gb, l40s), or run "
         "`runner calibrate --device cuda --out FILE` on the " + device + " and name FILE in hardware.profile";
}

ComputeProfile gpu_compute(const DeviceKind::Figures& g, const HardwareProfile& p) {
  ComputeProfile c;
  c.memory_bandwidth = g.mem_tbps * 1e12 * kAchievedMemory;
  c.launch_s = 5e-6;  // a kernel launch and its tail: a few microseconds
  const double fp32_eff[6] = {0.2, 0.5, 0.8, 0.9, 0.9, 0.9};
  for (int i = 0; i < 6; ++i) {
    const int64_t s = int64_t{256} << i;
    c.gemm["bf16"].push_back({s, s, s, g.gemm_eff[i] * p.peak_flops_bf16});
    c.gemm["fp16"].push_back({s, s, s, g.gemm_eff[i] * p.peak_flops_fp16});
    c.gemm["fp32"].push_back({s, s, s, fp32_eff[i] * p.peak_flops_fp32});
  }
  for (const char* dt : {"bf16", "fp16"}) {
    const double peak = std::string(dt) == "bf16" ? p.peak_flops_bf16 : p.peak_flops_fp16;
    for (int64_t hd : {64, 128})
      for (auto [seq, f] : {std::pair{512, 0.6}, std::pair{2048, 0.9}, std::pair{4096, 1.0}}) {
        const double fwd = g.attn_eff * f * (hd == 64 ? 0.85 : 1.0) * peak;
        c.attention[dt].push_back({seq, hd, fwd, 0.85 * fwd});
      }
  }
  return c;
}

HardwareProfile gpu_builtin(const HardwareConfig& hw, const DeviceKind::Figures& g) {
  HardwareProfile p;
  p.peak_flops_fp32 = device_peak_flops(hw, FloatFormat::fp32);
  p.peak_flops_bf16 = device_peak_flops(hw, FloatFormat::bf16);
  p.peak_flops_fp16 = device_peak_flops(hw, FloatFormat::fp16);
  p.compute.push_back(gpu_compute(g, p));
  p.intra_node = {g.intra_lat_us * 1e-6, g.link_gbps * 1e9 * kNcclBus};
  p.inter_node = {g.inter_lat_us * 1e-6, g.nic_gbps * 1e9 * kNcclBus};
  return p;
}

// The speed of a 16-bit Linear relative to fp32's on this CPU, from the GEMM path choice the
// executor runs with (ops/gemm_path.h: widened to sgemm, or oneDNN, measured once per process);
// 1 where it was not measured.
double cpu_16bit_ratio(DType t) {
  const ops::GemmChoice& c = ops::gemm_paths().of(t);
  const double chosen = c.path == ops::GemmPath::Sgemm ? c.sgemm_gflops : c.onednn_gflops;
  return chosen > 0 && c.fp32_gflops > 0 ? chosen / c.fp32_gflops : 1.0;
}

// The CPU: this host's sgemm peak (measured once and cached, runner/perf/peak.h) at all its
// cores, shared by the threads in proportion, at a flat 90% for every shape (the roofline bound
// slows the small ones), 16-bit GEMMs scaled by their path's measured speed against fp32's; a
// modest memory bandwidth; ranks talk through shared memory.
HardwareProfile cpu_builtin(const HardwareConfig& hw) {
  HardwareProfile p;
  p.cores = std::max(1, int(std::thread::hardware_concurrency()));
  // Measured (and cached) at the thread count this process runs with, the figure the run's MFU
  // line reads, so a run measures and caches one peak, not two; scaled to all the cores.
  const int n = std::clamp(ops::num_threads(), 1, p.cores);
  const double peak = mfu_peak(hw, FloatFormat::fp32, n).flops * p.cores / n;
  const std::map<std::string, double> scale{
      {"fp32", 1.0}, {"bf16", cpu_16bit_ratio(DType::BF16)}, {"fp16", cpu_16bit_ratio(DType::F16)}};
  p.peak_flops_fp32 = peak;
  p.peak_flops_bf16 = peak * std::max(1.0, scale.at("bf16"));
  p.peak_flops_fp16 = peak * std::max(1.0, scale.at("fp16"));
  std::vector<int> threads;
  for (int t = 1; t < p.cores; t *= 2) threads.push_back(t);
  threads.push_back(p.cores);
  for (int t : threads) {
    ComputeProfile c;
    c.threads = t;
    const double rate = 0.9 * peak * t / p.cores;
    for (const auto& [dt, f] : scale)
      for (int64_t s : {64, 4096}) c.gemm[dt].push_back({s, s, s, rate * f});
    c.memory_bandwidth = 5e9 * std::min(t, 4);  // ~5 GB/s a core, saturating the channels at ~20
    c.launch_s = 2e-6;
    p.compute.push_back(std::move(c));
  }
  p.intra_node = {1e-6, 5e9};       // shared memory through MPI: ~1 us, a few GB/s
  p.inter_node = {30e-6, 1.25e9};   // 10 Gb/s Ethernet
  return p;
}

// The recipe's topology on top of a profile (file or built in). A link the recipe states
// replaces the profile's, and the measured collective fits at that level go with it: they
// measured the link the recipe says is not the one it runs on.
void apply_topology(HardwareProfile& p, const HardwareConfig& hw) {
  p.devices_per_node = hw.devices_per_node;
  p.nodes = hw.nodes;
  auto set = [&](Link& l, bool inter, double gbps, double lat_us) {
    if (gbps <= 0 && lat_us <= 0) return;
    if (gbps > 0) l.bandwidth = gbps * 1e9;
    if (lat_us > 0) l.latency_s = lat_us * 1e-6;
    std::erase_if(p.collectives, [&](const CollectiveFit& f) { return f.inter_node == inter; });
  };
  set(p.intra_node, false, hw.intra_node_gbps, hw.intra_node_latency_us);
  set(p.inter_node, true, hw.inter_node_gbps, hw.inter_node_latency_us);
}

bool device_matches(const std::string& profile_device, const std::string& recipe_device) {
  if (profile_device == recipe_device) return true;
  const bool pcpu = profile_device.starts_with("cpu"), rcpu = recipe_device.starts_with("cpu");
  if (pcpu || rcpu) return pcpu && rcpu;  // cpu and cpu-strict run the same kernels
  return profile_device == "cuda" || recipe_device == "cuda";  // "whichever GPU is found"
}

}  // namespace

HardwareProfile builtin_profile(const HardwareConfig& hw) {
  HardwareProfile p;
  const DeviceKind& kind = device_kind(hw);
  if (kind.host) {
    p = cpu_builtin(hw);
  } else {
    // `cuda` and `custom` are no one model: a profile from another device's figures would price
    // every layout wrongly without a word, so they need a calibrated one.
    if (!kind.figures.known())
      throw UserError(SourceLoc{}, "hardware.device " + hw.device + " has no built-in hardware profile (the device "
                                   "table has no figures for it: memory bandwidth, links, GEMM efficiency)",
                      builtin_fix(hw.device));
    p = gpu_builtin(hw, kind.figures);
  }
  p.device = hw.device;
  p.source = "built-in (device table): run `runner calibrate` for measured figures";
  apply_topology(p, hw);
  return p;
}

HardwareProfile hardware_profile(const HardwareConfig& hw) { return hardware_profile(hw, hw.profile); }

HardwareProfile hardware_profile(const HardwareConfig& hw, const std::string& profile_file) {
  if (profile_file.empty()) return builtin_profile(hw);
  const std::string key = profile_file == hw.profile ? "hardware.profile" : "--profile";
  std::ifstream in(profile_file);
  if (!in)
    throw UserError(SourceLoc{profile_file}, key + " names " + profile_file + ", which cannot be read", kCalibrateFix);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(SourceLoc{profile_file}, key + " names " + profile_file + ", which is not JSON (" + e.what() + ")",
                    kCalibrateFix);
  }
  HardwareProfile p;
  try {
    p = HardwareProfile::from_json(j, profile_file);
  } catch (const UserError& e) {
    throw UserError(e.loc(), key + " names " + profile_file + ": " + e.problem(), e.fix());
  }
  if (!device_matches(p.device, hw.device))
    throw UserError(SourceLoc{profile_file},
                    key + " names " + profile_file + ", a profile of " + p.device + ", but hardware.device is " + hw.device,
                    "calibrate on a " + hw.device + " (`runner calibrate --out FILE`), or remove hardware.profile");
  p.source = "calibrated: " + profile_file + (p.source.empty() ? "" : " (" + p.source + ")");
  apply_topology(p, hw);
  return p;
}

}  // namespace runner
