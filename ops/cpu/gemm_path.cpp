// The measured choice of GEMM path per 16-bit dtype (see ops/gemm_path.h).
//
// The probe is one Linear of GPT-2 small's attention input, 512 rows of 768 -> 2304, run as
// the executor runs it on each path: widen x, W (and dy) to fp32 then sgemm forward, d(input)
// and d(weight); or oneDNN on the 16-bit operands directly. The two paths alternate, best of
// three after a warm-up (which also creates oneDNN's primitives): ~0.2 s on 2 cores.
#include "ops/gemm_path.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/cpu/dnnl_gemm.h"
#include "ops/knobs.h"
#include "ops/rng.h"

namespace ops {

namespace {

constexpr int kProbeN = 512, kProbeC = 768, kProbeOC = 2304, kProbeReps = 3;

std::string gflops_str(double g) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", g);
  return b;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) continue;
    o += ch;
  }
  return o + "\"";
}

std::string json_num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::vector<uint16_t> random16(DType t, size_t n, uint64_t seed, float scale) {
  std::vector<float> f(n);
  const uint64_t key = rng_key(0x9e33, seed);
  for (size_t i = 0; i < n; ++i) f[i] = scale * rng_normal(key, i);
  std::vector<uint16_t> h(n);
  from_f32(h.data(), t, f.data(), static_cast<int64_t>(n));
  return h;
}

GemmChoice choose(DType t, GemmMode mode) {
  GemmChoice c;
  c.dtype = t;
  c.onednn_available = cpu_backend().has(ops::Kernel::MatmulForward, t);
  const std::string info = cpu::dnnl_gemm_info(t);
  if (c.onednn_available) c.onednn_impl = info;
  const std::string unavailable = gemm_path_name(GemmPath::OneDnn, t) + " unavailable: " + info;
  switch (mode) {
    case GemmMode::Sgemm:
      c.why = "RUNNER_GEMM_PATH=sgemm";
      break;
    case GemmMode::OneDnn:
      c.why = "RUNNER_GEMM_PATH=onednn";
      if (c.onednn_available) c.path = GemmPath::OneDnn;
      else c.why += ", but " + unavailable;
      break;
    case GemmMode::Auto:
      if (!c.onednn_available) {
        c.why = unavailable;
        break;
      }
      GemmMeasurement m = measure_gemm_paths(t, kProbeN, kProbeC, kProbeOC, kProbeReps);
      c.sgemm_gflops = m.sgemm_gflops;
      c.onednn_gflops = m.onednn_gflops;
      c.fp32_gflops = m.fp32_gflops;
      c.path = faster_path(m.sgemm_gflops, m.onednn_gflops);
      c.why = "measured";
      break;
  }
  return c;
}

std::mutex g_mu;
std::optional<GemmPaths> g_paths;

}  // namespace

std::string gemm_path_name(GemmPath p, DType t) {
  if (p == GemmPath::Sgemm) return "fp32-sgemm";
  return std::string(p == GemmPath::Device ? "cublaslt-" : "onednn-") + dtype_name(t);
}

const char* gemm_mode_name(GemmMode m) {
  switch (m) {
    case GemmMode::OneDnn: return "onednn";
    case GemmMode::Sgemm: return "sgemm";
    case GemmMode::Device: return "device";
    default: return "auto";
  }
}

GemmMode gemm_mode_from_env() {
  const std::string s = knobs().gemm_path;
  if (s.empty()) return GemmMode::Auto;
  if (s == "auto") return GemmMode::Auto;
  if (s == "onednn") return GemmMode::OneDnn;
  if (s == "sgemm") return GemmMode::Sgemm;
  throw std::invalid_argument("RUNNER_GEMM_PATH=" + s +
                              ": expected auto (measure), onednn (oneDNN's 16-bit matmul) or sgemm (widen to fp32)");
}

GemmPath faster_path(double sgemm_gflops, double onednn_gflops) {
  return onednn_gflops > sgemm_gflops ? GemmPath::OneDnn : GemmPath::Sgemm;
}

std::string GemmChoice::summary() const {
  std::string s = std::string(dtype_name(dtype)) + ": " + path_name() + " (";
  if (sgemm_gflops > 0 || onednn_gflops > 0) {
    // The chosen path's number first.
    const std::string sg = "sgemm " + gflops_str(sgemm_gflops) + " GFLOP/s";
    const std::string dn = gemm_path_name(GemmPath::OneDnn, dtype) + " " + gflops_str(onednn_gflops) + " GFLOP/s";
    s += path == GemmPath::OneDnn ? dn + " vs " + sg : sg + " vs " + dn;
  } else {
    s += why;
  }
  return s + ")";
}

std::string GemmPaths::summary() const { return bf16.summary() + "; " + f16.summary(); }

std::string GemmPaths::to_json() const {
  auto one = [](const GemmChoice& c) {
    return "{\"path\":" + json_str(c.path_name()) + ",\"sgemm_gflops\":" + json_num(c.sgemm_gflops) +
           ",\"onednn_gflops\":" + json_num(c.onednn_gflops) + ",\"fp32_gflops\":" + json_num(c.fp32_gflops) + ",\"why\":" + json_str(c.why) +
           ",\"onednn_impl\":" + json_str(c.onednn_impl) + "}";
  };
  return "{\"mode\":" + json_str(gemm_mode_name(mode)) + ",\"probe\":[" + std::to_string(probe_N) + "," +
         std::to_string(probe_C) + "," + std::to_string(probe_OC) + "],\"bf16\":" + one(bf16) +
         ",\"f16\":" + one(f16) + "}";
}

GemmPaths choose_gemm_paths(GemmMode mode) {
  GemmPaths p;
  p.mode = mode;
  p.probe_N = kProbeN;
  p.probe_C = kProbeC;
  p.probe_OC = kProbeOC;
  p.bf16 = choose(DType::BF16, mode);
  p.f16 = choose(DType::F16, mode);
  return p;
}

namespace {
thread_local const GemmPaths* t_scoped = nullptr;  // ScopedGemmPaths
}  // namespace

ScopedGemmPaths::ScopedGemmPaths(const GemmPaths& p) : paths_(p), prev_(t_scoped) { t_scoped = &paths_; }
ScopedGemmPaths::~ScopedGemmPaths() { t_scoped = prev_; }

GemmPaths device_gemm_paths() {
  GemmPaths p;
  p.mode = GemmMode::Device;
  for (GemmChoice* c : {&p.bf16, &p.f16}) {
    c->path = GemmPath::Device;
    c->why = "the GPU's cuBLASLt reads 16-bit operands as stored, fp32 accumulation";
  }
  p.bf16.dtype = DType::BF16;
  p.f16.dtype = DType::F16;
  return p;
}

bool gemm_paths_on_device() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_paths && g_paths->mode == GemmMode::Device;
}

bool gemm_paths_device_now() { return t_scoped ? t_scoped->mode == GemmMode::Device : gemm_paths_on_device(); }

const GemmPaths& gemm_paths() {
  if (t_scoped) return *t_scoped;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_paths) g_paths = choose_gemm_paths();
  return *g_paths;
}

void set_gemm_paths(const GemmPaths& p) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_paths = p;
}

GemmPath gemm_path(DType t) {
  if (t != DType::BF16 && t != DType::F16) return GemmPath::Sgemm;
  return gemm_paths().of(t).path;
}

GemmMeasurement measure_gemm_paths(DType t, int N, int C, int OC, int reps) {
  using Clock = std::chrono::steady_clock;
  Backend& be = cpu_backend();
  const size_t nx = static_cast<size_t>(N) * C, nw = static_cast<size_t>(OC) * C, ny = static_cast<size_t>(N) * OC;
  const auto x16 = random16(t, nx, 1, 1.0f), w16 = random16(t, nw, 2, 0.02f), dy16 = random16(t, ny, 3, 1.0f);
  std::vector<float> x32(nx), w32(nw), dy32(ny), y(ny), dx(nx, 0.0f), dw(nw, 0.0f);
  const bool dnnl = be.has(ops::Kernel::MatmulForward, t);
  // One Linear's forward and backward as the executor runs it on each path.
  auto sgemm_round = [&] {
    to_f32(x32.data(), x16.data(), t, static_cast<int64_t>(nx));
    to_f32(w32.data(), w16.data(), t, static_cast<int64_t>(nw));
    be.run(k::MatmulForward(y.data(), x32.data(), w32.data(), nullptr, N, C, OC));
    to_f32(x32.data(), x16.data(), t, static_cast<int64_t>(nx));
    to_f32(w32.data(), w16.data(), t, static_cast<int64_t>(nw));
    to_f32(dy32.data(), dy16.data(), t, static_cast<int64_t>(ny));
    be.run(k::MatmulBackward(dx.data(), dw.data(), nullptr, dy32.data(), x32.data(), w32.data(), N, C, OC));
  };
  // fp32 compute: the same GEMMs on operands already in fp32.
  auto fp32_round = [&] {
    be.run(k::MatmulForward(y.data(), x32.data(), w32.data(), nullptr, N, C, OC));
    be.run(k::MatmulBackward(dx.data(), dw.data(), nullptr, dy32.data(), x32.data(), w32.data(), N, C, OC));
  };
  auto onednn_round = [&] {
    be.run(k::MatmulForward(y.data(), x16.data(), w16.data(), nullptr, N, C, OC), t);
    be.run(k::MatmulBackward(dx.data(), dw.data(), nullptr, dy16.data(), x16.data(), w16.data(), N, C, OC), t);
  };
  auto seconds = [](const auto& f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  double best_s = 1e30, best_d = 1e30, best_f = 1e30;
  sgemm_round();
  if (dnnl) onednn_round();
  for (int r = 0; r < std::max(reps, 1); ++r) {  // alternate, so that all see the same clock
    best_s = std::min(best_s, seconds(sgemm_round));
    if (dnnl) best_d = std::min(best_d, seconds(onednn_round));
    best_f = std::min(best_f, seconds(fp32_round));
  }
  const double flops = 6.0 * N * C * OC;
  GemmMeasurement m;
  m.sgemm_gflops = flops / best_s * 1e-9;
  m.onednn_gflops = dnnl ? flops / best_d * 1e-9 : 0.0;
  m.fp32_gflops = flops / best_f * 1e-9;
  return m;
}

}  // namespace ops
