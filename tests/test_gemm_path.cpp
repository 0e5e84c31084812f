// The 16-bit GEMM path (ops/gemm_path.h): oneDNN's bf16 matmul, reading the Linear's operands as
// stored, gives the sgemm path's numbers within bf16 rounding; the dry run stays exact on both
// paths (no fp32 copies of a oneDNN Linear's operands are made or counted); the chooser takes the
// faster measured path; RUNNER_GEMM_PATH overrides it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/convert.h"
#include "ops/cpu/dnnl_gemm.h"
#include "ops/executor.h"
#include "ops/gemm_path.h"
#include "ops/ops.h"
#include "ops/rng.h"
#include "runner/model/gpt.h"
#include "tests/support/env.h"
#include "tests/support/models.h"

namespace {

using ops::DType;
using ops::GemmMode;
using ops::GemmPath;

// Sets RUNNER_GEMM_PATH for one scope (nullptr: unset) and restores what was there.
struct EnvGuard : test_support::ScopedEnv {
  explicit EnvGuard(const char* v) : ScopedEnv("RUNNER_GEMM_PATH", v) {}
};

// Forces this process's GEMM paths for one scope (executors built inside see them).
struct PathGuard {
  ops::GemmPaths old = ops::gemm_paths();
  explicit PathGuard(GemmMode m) { ops::set_gemm_paths(ops::choose_gemm_paths(m)); }
  ~PathGuard() { ops::set_gemm_paths(old); }
};

// Whether oneDNN's bf16 matmul can run here; says why not otherwise.
bool onednn_bf16_here() {
#ifndef RUNNER_HAVE_DNNL
  MESSAGE("skipped: built without oneDNN (install libdnnl-dev: scripts/setup.sh)");
  return false;
#else
  if (ops::cpu_backend().has(ops::Kernel::MatmulForward, DType::BF16)) return true;
  MESSAGE("skipped: built with oneDNN, but this CPU has no bf16 matmul: " << ops::cpu::dnnl_gemm_info(DType::BF16));
  return false;
#endif
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  std::vector<float> f(n);
  const uint64_t key = ops::rng_key(0x7e57, seed);
  for (size_t i = 0; i < n; ++i) f[i] = scale * ops::rng_normal(key, i);
  std::vector<uint16_t> h(n);
  ops::from_f32(h.data(), DType::BF16, f.data(), static_cast<int64_t>(n));
  return h;
}
std::vector<double> widen(const std::vector<uint16_t>& h) {
  std::vector<double> d(h.size());
  for (size_t i = 0; i < h.size(); ++i) d[i] = ops::bf16_to_f32(h[i]);
  return d;
}

struct LinearShape {
  int N, IC, OC;
  bool bias;
  DType out;  // y's dtype: BF16, or F32 as the logits are (then the backward is widened)
};

struct LinearResult {
  std::vector<double> y, dx, dw, db;  // y and dx as stored (bf16 or fp32), dW and db fp32 buffers
  size_t ws_predicted = 0, ws_measured = 0;
};

// One Linear node as a pipeline stage: x (bf16) comes in as the stage input, y leaves as the stage
// output; W and b are bf16 parameters with fp32 gradient buffers.
// dy32 (fp32 y only): d(y) as given, instead of dy16 widened; dout16: the node reads it rounded
// to bf16 (the output layer under precision.logits_grad: compute).
LinearResult run_linear(const LinearShape& s, const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                        const std::vector<uint16_t>& b, const std::vector<uint16_t>& dy16,
                        const std::vector<float>* dy32 = nullptr, bool dout16 = false) {
  ops::Graph g;
  g.B = 1;
  g.T = s.N;
  ops::Node n;
  n.kind = ops::OpKind::Linear;
  n.name = "linear";
  n.layer = 0;
  n.module = ops::Module::none;
  n.dout16 = dout16;
  g.stage_input = g.add_activation("x", {s.N, s.IC}, 0, DType::BF16);
  n.in.push_back(g.stage_input);
  const int wid = g.add_param("W", {s.OC, s.IC}, 0);
  g.tensors[wid].dtype = DType::BF16;
  n.in.push_back(wid);
  int bid = -1;
  if (s.bias) {
    bid = g.add_param("b", {s.OC}, 0);
    g.tensors[bid].dtype = DType::BF16;
    n.in.push_back(bid);
  }
  g.stage_output = g.add_activation("y", {s.N, s.OC}, 0, s.out);
  n.out.push_back(g.stage_output);
  g.add_node(n);
  g.finalize();

  ops::Tensor W({s.OC, s.IC}, DType::BF16, ops::Account::Parameters), dW({s.OC, s.IC}, DType::F32, ops::Account::Gradients);
  std::memcpy(W.raw(), w.data(), w.size() * 2);
  ops::Tensor B({s.OC}, DType::BF16, ops::Account::Parameters), dB({s.OC}, DType::F32, ops::Account::Gradients);
  std::memcpy(B.raw(), b.data(), b.size() * 2);
  ops::Executor ex(g, ops::cpu_backend());
  ex.bind_param(wid, &W, &dW);
  if (s.bias) ex.bind_param(bid, &B, &dB);

  const size_t ny = static_cast<size_t>(s.N) * s.OC, nx = static_cast<size_t>(s.N) * s.IC;
  const size_t ysize = s.out == DType::F32 ? 4 : 2;
  std::vector<char> y(ny * ysize), dy(ny * ysize);
  if (s.out == DType::F32) {
    std::vector<float> d32(ny);
    if (dy32) d32 = *dy32;
    else ops::to_f32(d32.data(), dy16.data(), DType::BF16, static_cast<int64_t>(ny));
    std::memcpy(dy.data(), d32.data(), ny * 4);
  } else {
    std::memcpy(dy.data(), dy16.data(), ny * 2);
  }
  std::vector<uint16_t> dx(nx);

  const ops::MemoryEstimate est = ops::Executor::simulate(g);
  auto& mt = ops::MemoryTracker::instance();
  const size_t ws0 = mt.current(ops::Account::Workspace);
  mt.reset_peaks();
  ex.forward(nullptr, nullptr, true, 1, 0, x.data(), y.data());
  ex.backward(1.0f, dy.data(), dx.data());

  LinearResult r;
  r.ws_predicted = est.peak[static_cast<int>(ops::Account::Workspace)];
  r.ws_measured = mt.peak(ops::Account::Workspace) - ws0;
  CHECK(mt.current(ops::Account::Workspace) == ws0);
  r.y.resize(ny);
  for (size_t i = 0; i < ny; ++i) {
    if (s.out == DType::F32) r.y[i] = reinterpret_cast<const float*>(y.data())[i];
    else r.y[i] = ops::bf16_to_f32(reinterpret_cast<const uint16_t*>(y.data())[i]);
  }
  r.dx = widen(dx);
  r.dw.assign(dW.data<float>(), dW.data<float>() + dW.numel());
  if (s.bias) r.db.assign(dB.data<float>(), dB.data<float>() + dB.numel());
  return r;
}

// Tolerance (both results are rounded to bf16 once at the end, from fp32 sums of the same bf16
// operands):
//  - A product of two bf16 numbers (8-bit significands) is exact in fp32 (24 bits), so the two
//    paths differ only in how they add the K products (plus the bias) in fp32. With the
//    standard bound for recursive summation, each path's fp32 sum is within
//    gamma_K * S = K u / (1 - K u) * S of the exact one, S = sum_k |a_k b_k| (+ |bias|), u = 2^-24
//    (blocked or pairwise orders do no worse), so the two fp32 sums differ by <= 2 gamma_{K+1} S.
//  - Rounding to bf16 can then move the two neighbours to adjacent bf16 values: one more unit in
//    the last place, <= eps_bf16 * |v| with eps_bf16 = 2^-7 (8-bit significand).
//  So |a - b| <= 2^-7 * max(|a|, |b|) + 2 (K+1) 2^-24 / (1 - (K+1) 2^-24) * S, checked per element.
// For y stored in fp32 (the logits case) there is no final rounding: the 2^-7 term is not used.
double tol(double a, double b, int K, double S, bool rounded16) {
  const double u = std::ldexp(1.0, -24), k = K + 1;
  return (rounded16 ? std::ldexp(1.0, -7) * std::max(std::fabs(a), std::fabs(b)) : 0.0) + 2 * k * u / (1 - k * u) * S;
}

}  // namespace

TEST_CASE("faster_path takes the faster measured path, sgemm on ties and without a oneDNN number") {
  CHECK(ops::faster_path(290, 160) == GemmPath::Sgemm);
  CHECK(ops::faster_path(290, 900) == GemmPath::OneDnn);
  CHECK(ops::faster_path(200, 200) == GemmPath::Sgemm);
  CHECK(ops::faster_path(200, 0) == GemmPath::Sgemm);
  CHECK(ops::gemm_path(DType::F32) == GemmPath::Sgemm);  // fp32 always takes sgemm
}

TEST_CASE("the chooser measures both paths and takes the faster; the choice reads as a line and as JSON") {
  const ops::GemmPaths p = ops::choose_gemm_paths(GemmMode::Auto);
  for (const ops::GemmChoice* c : {&p.bf16, &p.f16}) {
    CAPTURE(c->summary());
    if (c->onednn_available) {
      CHECK(c->why == "measured");
      CHECK(c->sgemm_gflops > 0);
      CHECK(c->onednn_gflops > 0);
      CHECK(c->path == ops::faster_path(c->sgemm_gflops, c->onednn_gflops));
      CHECK(c->summary().find("GFLOP/s") != std::string::npos);
      CHECK(!c->onednn_impl.empty());
    } else {
      CHECK(c->path == GemmPath::Sgemm);
      CHECK(c->why.find("unavailable") != std::string::npos);
    }
  }
  MESSAGE("GEMM paths on this machine: " << p.summary());
  const auto j = nlohmann::json::parse(p.to_json());
  CHECK(j["mode"] == "auto");
  CHECK(j["bf16"]["path"] == p.bf16.path_name());
  CHECK(j["f16"]["path"] == p.f16.path_name());
  CHECK(j["probe"].size() == 3);
  CHECK(std::fabs(j["bf16"]["sgemm_gflops"].get<double>() - p.bf16.sgemm_gflops) < 0.1);
}

TEST_CASE("RUNNER_GEMM_PATH overrides the measurement") {
  {
    EnvGuard e(nullptr);
    CHECK(ops::gemm_mode_from_env() == GemmMode::Auto);
  }
  {
    EnvGuard e("auto");
    CHECK(ops::gemm_mode_from_env() == GemmMode::Auto);
  }
  {
    EnvGuard e("sgemm");
    const ops::GemmPaths p = ops::choose_gemm_paths();
    CHECK(p.mode == GemmMode::Sgemm);
    CHECK(p.bf16.path == GemmPath::Sgemm);
    CHECK(p.f16.path == GemmPath::Sgemm);
    CHECK(p.bf16.sgemm_gflops == 0);  // forced: nothing measured
    CHECK(p.bf16.summary() == "bf16: fp32-sgemm (RUNNER_GEMM_PATH=sgemm)");
  }
  {
    EnvGuard e("onednn");
    const ops::GemmPaths p = ops::choose_gemm_paths();
    CHECK(p.mode == GemmMode::OneDnn);
    if (onednn_bf16_here()) {
      CHECK(p.bf16.path == GemmPath::OneDnn);
      CHECK(p.bf16.summary() == "bf16: onednn-bf16 (RUNNER_GEMM_PATH=onednn)");
    } else {
      CHECK(p.bf16.path == GemmPath::Sgemm);
      CHECK(p.bf16.why.find("unavailable") != std::string::npos);
    }
    // fp16: oneDNN where it has a kernel (AVX512-FP16), sgemm with the reason otherwise.
    CHECK(p.f16.path == (p.f16.onednn_available ? GemmPath::OneDnn : GemmPath::Sgemm));
  }
  {
    EnvGuard e("onedn");
    CHECK_THROWS_AS(ops::gemm_mode_from_env(), std::invalid_argument);
  }
}

TEST_CASE("bf16 Linear forward and backward on oneDNN match the sgemm path; the dry run stays exact") {
#ifdef RUNNER_HAVE_DNNL
  // This build has oneDNN; on a CPU with AVX512-BF16 or AMX (this project's machines) its bf16
  // matmul must be there, so a broken probe does not pass as a skip.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) REQUIRE_MESSAGE(ops::cpu_backend().has(ops::Kernel::MatmulForward, DType::BF16),
                                                         ops::cpu::dnnl_gemm_info(DType::BF16));
#endif
  if (!onednn_bf16_here()) return;
  const LinearShape shapes[] = {{37, 53, 29, true, DType::BF16},   {1, 7, 3, true, DType::BF16},
                                {130, 200, 71, false, DType::BF16}, {5, 768, 301, true, DType::BF16},
                                {33, 64, 97, false, DType::F32},    {19, 31, 250, true, DType::F32}};
  for (const LinearShape& s : shapes) {
    CAPTURE(s.N);
    CAPTURE(s.IC);
    CAPTURE(s.OC);
    CAPTURE(s.bias);
    const std::string out_dtype = ops::dtype_name(s.out);
    CAPTURE(out_dtype);
    const uint64_t seed = static_cast<uint64_t>(s.N) * 1009 + s.IC * 31 + s.OC;
    const auto x = random_bf16(static_cast<size_t>(s.N) * s.IC, seed, 1.0f);
    const auto w = random_bf16(static_cast<size_t>(s.OC) * s.IC, seed + 1, 0.2f);
    const auto b = random_bf16(static_cast<size_t>(s.OC), seed + 2, 0.5f);
    const auto dy = random_bf16(static_cast<size_t>(s.N) * s.OC, seed + 3, 1.0f);
    LinearResult ref, dnn;
    {
      PathGuard pg(GemmMode::Sgemm);
      ref = run_linear(s, x, w, b, dy);
    }
    {
      PathGuard pg(GemmMode::OneDnn);
      REQUIRE(ops::gemm_path(DType::BF16) == GemmPath::OneDnn);
      dnn = run_linear(s, x, w, b, dy);
    }
    // The ledger: predicted == allocated on each path, and oneDNN's holds no fp32 copies of
    // x, W, b (forward), nor of x, W, dy (backward, when dy is bf16; with an fp32 dy, as the
    // logits', the backward widens as the sgemm path does and sets the same peak).
    CHECK(ref.ws_predicted == ref.ws_measured);
    CHECK(dnn.ws_predicted == dnn.ws_measured);
    if (s.out == DType::BF16) CHECK(dnn.ws_measured < ref.ws_measured);
    else CHECK(dnn.ws_measured == ref.ws_measured);

    const auto xd = widen(x), wd = widen(w), bd = widen(b), dyd = widen(dy);
    const bool y16 = s.out == DType::BF16;
    int bad = 0;
    for (int r = 0; r < s.N; ++r)  // y = x W^T + b, K = IC
      for (int o = 0; o < s.OC; ++o) {
        double S = s.bias ? std::fabs(bd[o]) : 0.0;
        for (int i = 0; i < s.IC; ++i) S += std::fabs(xd[r * s.IC + i] * wd[o * s.IC + i]);
        const double a = ref.y[r * s.OC + o], c = dnn.y[r * s.OC + o];
        bad += std::fabs(a - c) > tol(a, c, s.IC, S, y16);
      }
    CHECK_MESSAGE(bad == 0, "y: " << bad << " elements outside the tolerance");
    bad = 0;
    for (int r = 0; r < s.N; ++r)  // dx = dy W, K = OC, stored in bf16
      for (int i = 0; i < s.IC; ++i) {
        double S = 0;
        for (int o = 0; o < s.OC; ++o) S += std::fabs(dyd[r * s.OC + o] * wd[o * s.IC + i]);
        const double a = ref.dx[r * s.IC + i], c = dnn.dx[r * s.IC + i];
        bad += std::fabs(a - c) > tol(a, c, s.OC, S, true);
      }
    CHECK_MESSAGE(bad == 0, "dx: " << bad << " elements outside the tolerance");
    bad = 0;
    for (int o = 0; o < s.OC; ++o)  // dW = dy^T x, K = N, rounded to bf16 before the fp32 buffer
      for (int i = 0; i < s.IC; ++i) {
        double S = 0;
        for (int r = 0; r < s.N; ++r) S += std::fabs(dyd[r * s.OC + o] * xd[r * s.IC + i]);
        const double a = ref.dw[o * s.IC + i], c = dnn.dw[o * s.IC + i];
        bad += std::fabs(a - c) > tol(a, c, s.N, S, true);
      }
    CHECK_MESSAGE(bad == 0, "dW: " << bad << " elements outside the tolerance");
    bad = 0;
    for (int o = 0; o < static_cast<int>(ref.db.size()); ++o) {  // db = column sums of dy, K = N
      double S = 0;
      for (int r = 0; r < s.N; ++r) S += std::fabs(dyd[r * s.OC + o]);
      bad += std::fabs(ref.db[o] - dnn.db[o]) > tol(ref.db[o], dnn.db[o], s.N, S, true);
    }
    CHECK_MESSAGE(bad == 0, "db: " << bad << " elements outside the tolerance");
  }
}

namespace {

struct ModelRun {
  double loss = 0;
  size_t ws_peak = 0;
  std::vector<std::vector<float>> grads;
};

ModelRun run_gpt(bool llama) {
  using namespace runner;
  ModelConfig m = test_support::small_model(61, 16, 32, 4, 2);
  if (llama) test_support::make_llama(m);
  GptSpec spec;
  spec.model = m;
  spec.B = 2;
  spec.act_dtype = DType::BF16;
  ops::Graph g = build_gpt_graph(spec);
  ParamSet ps = init_params(g, m, 11);
  ops::Executor ex(g, ops::cpu_backend());
  bind_params(ex, g, ps);
  auto [tok, tgt] = test_support::random_tokens(spec.B * m.seq_len, m.vocab_size);
  const ops::MemoryEstimate est = ops::Executor::simulate(g);
  auto& mt = ops::MemoryTracker::instance();
  const size_t act0 = mt.current(ops::Account::Activations), ws0 = mt.current(ops::Account::Workspace);
  mt.reset_peaks();
  auto l = ex.forward(tok.data(), tgt.data(), true, 1, 0);
  CHECK(mt.current(ops::Account::Activations) - act0 == est.activations_after_forward);
  ex.backward(1.0f / static_cast<float>(l.count));
  CHECK(mt.peak(ops::Account::Activations) - act0 == est.peak[static_cast<int>(ops::Account::Activations)]);
  CHECK(mt.peak(ops::Account::Workspace) - ws0 == est.peak[static_cast<int>(ops::Account::Workspace)]);
  ModelRun r;
  r.ws_peak = mt.peak(ops::Account::Workspace) - ws0;
  r.loss = l.sum / static_cast<double>(l.count);
  for (auto& t : ps.grads) r.grads.emplace_back(t.data<float>(), t.data<float>() + t.numel());
  return r;
}

}  // namespace

TEST_CASE("a bf16 GPT on oneDNN's path: the ledger is exact and it trains like the sgemm path") {
  if (!onednn_bf16_here()) return;
  for (bool llama : {false, true}) {
    CAPTURE(llama);
    ModelRun ref, dnn;
    {
      PathGuard pg(GemmMode::Sgemm);
      ref = run_gpt(llama);
    }
    {
      PathGuard pg(GemmMode::OneDnn);
      dnn = run_gpt(llama);
    }
    MESSAGE("workspace peak: sgemm path " << ref.ws_peak << " B, oneDNN path " << dnn.ws_peak << " B");
    // oneDNN's path ran: its Linears make no fp32 copies (the peak may sit elsewhere, e.g. in
    // attention, so it can only be lower or equal), and its sums run in another order, so the
    // gradients are not bit-identical to the sgemm path's.
    CHECK(dnn.ws_peak <= ref.ws_peak);
    CHECK(dnn.grads != ref.grads);
    // Both paths round the same values at the same places; they differ where an fp32 sum's last
    // bits push one rounding to the neighbouring bf16 value (2^-7 relative). Such flips are rare
    // and not aligned, and a gradient passes through about a dozen roundings (see
    // test_precision16), so the relative L2 distance stays near 2^-7 * sqrt(12) ~ 3e-2 in the worst
    // case; the bounds below are that, and a tenth of it for the loss (an average over tokens).
    CHECK(std::fabs(dnn.loss - ref.loss) < 3e-3 * ref.loss);
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      CAPTURE(i);
      double num = 0, den = 0;
      for (size_t k = 0; k < ref.grads[i].size(); ++k) {
        const double d = static_cast<double>(dnn.grads[i][k]) - ref.grads[i][k];
        num += d * d;
        den += static_cast<double>(ref.grads[i][k]) * ref.grads[i][k];
      }
      CHECK(std::sqrt(num / std::max(den, 1e-30)) < 3e-2);
    }
  }
}

// precision.logits_grad: compute. The output layer (bf16 x and W, fp32 y: the logits)
// reads its fp32 d(y) rounded to bf16 on both paths, so that oneDNN can read every operand as
// stored: its backward then holds no fp32 copy of W (the vocabulary's table, on a real model),
// and both paths give the GEMMs of the rounded d(y) within the summation bound above, while
// the unrounded d(y)'s results are outside it (the rounding is really there).
TEST_CASE("dout16: the logits' layer reads d(y) rounded to bf16 on the oneDNN and sgemm paths, the dry run exact") {
  if (!onednn_bf16_here()) return;
  for (const LinearShape& s : {LinearShape{37, 64, 301, false, DType::F32}, LinearShape{16, 96, 1000, false, DType::F32}}) {
    CAPTURE(s.N);
    CAPTURE(s.OC);
    const uint64_t seed = static_cast<uint64_t>(s.N) * 7 + s.OC;
    const auto x = random_bf16(static_cast<size_t>(s.N) * s.IC, seed, 1.0f);
    const auto w = random_bf16(static_cast<size_t>(s.OC) * s.IC, seed + 1, 0.2f);
    const std::vector<uint16_t> b;
    std::vector<float> dy(static_cast<size_t>(s.N) * s.OC);  // fp32 values, most not bf16's
    const uint64_t key = ops::rng_key(0x7e58, seed);
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = 1e-3f * ops::rng_normal(key, i);
    std::vector<uint16_t> dyr(dy.size());
    ops::from_f32(dyr.data(), DType::BF16, dy.data(), static_cast<int64_t>(dy.size()));
    LinearResult sg, dnn, plain;
    {
      PathGuard pg(GemmMode::Sgemm);
      sg = run_linear(s, x, w, b, {}, &dy, true);
    }
    {
      PathGuard pg(GemmMode::OneDnn);
      dnn = run_linear(s, x, w, b, {}, &dy, true);
      plain = run_linear(s, x, w, b, {}, &dy, false);  // today's default: widened, fp32 d(y)
    }
    CHECK(sg.ws_predicted == sg.ws_measured);
    CHECK(dnn.ws_predicted == dnn.ws_measured);
    CHECK(plain.ws_predicted == plain.ws_measured);
    // oneDNN's backward: a bf16 copy of d(y) (2 bytes per element) instead of fp32 copies of x,
    // W and the widened d(y)'s GEMMs; the sgemm path holds the bf16 and fp32 copies of d(y).
    CHECK(dnn.ws_measured < plain.ws_measured);
    CHECK(sg.ws_measured > plain.ws_measured);
    const auto xd = widen(x), wd = widen(w), dyd = widen(dyr);
    for (const LinearResult* r : {&sg, &dnn}) {
      int bad = 0, off = 0;
      for (int i = 0; i < s.N; ++i)  // dx = round(dy) W, stored in bf16
        for (int c = 0; c < s.IC; ++c) {
          double exact = 0, S = 0;
          for (int o = 0; o < s.OC; ++o) {
            exact += dyd[i * s.OC + o] * wd[o * s.IC + c];
            S += std::fabs(dyd[i * s.OC + o] * wd[o * s.IC + c]);
          }
          const double a = r->dx[i * s.IC + c];
          bad += std::fabs(a - exact) > tol(a, exact, s.OC, S, true);
        }
      for (int o = 0; o < s.OC; ++o)  // dW = round(dy)^T x, fp32 (no final rounding)
        for (int c = 0; c < s.IC; ++c) {
          double exact = 0, unrounded = 0, S = 0;
          for (int i = 0; i < s.N; ++i) {
            exact += dyd[i * s.OC + o] * xd[i * s.IC + c];
            unrounded += static_cast<double>(dy[i * s.OC + o]) * xd[i * s.IC + c];
            S += std::fabs(dyd[i * s.OC + o] * xd[i * s.IC + c]);
          }
          const double a = r->dw[o * s.IC + c];
          bad += std::fabs(a - exact) > tol(a, exact, s.N, S, false);
          off += std::fabs(a - unrounded) > tol(a, unrounded, s.N, S, false);
        }
      CHECK_MESSAGE(bad == 0, bad << " elements of dx, dW outside the bound around round(dy)'s products");
      CHECK_MESSAGE(off > s.OC * s.IC / 4, "dW looks computed from the unrounded d(y): " << off << " elements off it");
    }
    // Forward is untouched by the switch.
    CHECK(dnn.y == plain.y);
  }
}
