// Kernel benchmark for the CPU backend: GEMM throughput at the shapes a GPT step runs (fp32
// sgemm, and the two 16-bit paths of ops/gemm_path.h at GPT-2 124M's shapes), attention
// forward/backward, and the pointwise kernels (--native16: 16-bit native vs widened vs fp32, attention
// included; --gemm16: the 16-bit GEMM paths alone; --dweight: what the thread-independent 16-bit
// weight gradient costs against oneDNN's own split), at the current OpenMP thread count. Run as
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE build/bench_kernels [--quick] [--attention] [--native16]
//       [--gemm16] [--dweight]
// Each number is the best of several repetitions (the minimum is the least noisy
// estimate on a shared machine), after one warm-up call.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/dnnl_gemm.h"
#include "ops/gemm_path.h"
#include "ops/rng.h"

#define ATTN_SAVED(T) (static_cast<size_t>(T))

namespace {


int g_reps = 7;

// Best wall time of f() in seconds over g_reps runs (or reps), after one warm-up.
double best_time(const std::function<void()>& f, int reps = 0) { return bench::best_time(f, reps > 0 ? reps : g_reps); }

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) { return bench::randn(n, 0xbe7c, seed, scale); }

void bench_gemm(ops::Backend& be) {
  std::printf("\n== GEMM (cblas_sgemm via matmul_forward/backward), GFLOP/s ==\n");
  std::printf("%-34s %9s %9s %9s\n", "shape (N x C -> OC)", "fwd", "bwd dinp", "bwd dW");
  struct Shape {
    int N, C, OC;
    const char* what;
  };
  const Shape shapes[] = {
      {1024, 1024, 1024, "square 1024^3"},
      {2048, 384, 1152, "GPT qkv      (B*T=2048, C=384)"},
      {2048, 384, 1536, "GPT mlp fc   (C=384 -> 4C)"},
      {2048, 1536, 384, "GPT mlp proj (4C -> C)"},
      {2048, 384, 384, "GPT attn proj"},
      {256, 768, 50304, "lm head      (N=256, C=768, V=50304)"},
  };
  for (const Shape& s : shapes) {
    const auto inp = randn(static_cast<size_t>(s.N) * s.C, 1), w = randn(static_cast<size_t>(s.OC) * s.C, 2, 0.02f),
               b = randn(s.OC, 3), dout = randn(static_cast<size_t>(s.N) * s.OC, 4);
    std::vector<float> out(static_cast<size_t>(s.N) * s.OC), dinp(inp.size()), dw(w.size());
    const double flops = 2.0 * s.N * s.C * s.OC;
    const double tf = best_time([&] { be.run(ops::k::MatmulForward(out.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC)); });
    const double ti = best_time([&] {
      be.run(ops::k::MatmulBackward(dinp.data(), nullptr, nullptr, dout.data(), inp.data(), w.data(), s.N, s.C, s.OC));
    });
    const double tw = best_time([&] {
      be.run(ops::k::MatmulBackward(nullptr, dw.data(), nullptr, dout.data(), inp.data(), w.data(), s.N, s.C, s.OC));
    });
    char name[64];
    std::snprintf(name, sizeof name, "%d x %d -> %d", s.N, s.C, s.OC);
    std::printf("%-34s %9.1f %9.1f %9.1f   %s\n", name, flops / tf * 1e-9, flops / ti * 1e-9, flops / tw * 1e-9,
                s.what);
  }
}

std::vector<uint16_t> randn16(ops::DType t, size_t n, uint64_t seed, float scale = 1.0f) {
  const auto f = randn(n, seed, scale);
  std::vector<uint16_t> h(n);
  ops::from_f32(h.data(), t, f.data(), static_cast<int64_t>(n));
  return h;
}

// The two paths of a 16-bit Linear (ops/gemm_path.h), per GEMM: widen the 16-bit operands that
// GEMM reads to fp32 and call sgemm (what the executor does by default), or oneDNN's matmul on
// the operands as stored. GPT-2 124M (C=768, 4C=3072, V=50304) at B*T = 1024 rows.
void bench_gemm16(ops::Backend& be, ops::DType t) {
  const std::string dn = ops::gemm_path_name(ops::GemmPath::OneDnn, t);
  std::printf("\n== 16-bit GEMM paths (%s): widen + sgemm vs %s, GFLOP/s, GPT-2 124M shapes ==\n",
              ops::dtype_name(t), dn.c_str());
  if (!be.has(ops::Kernel::MatmulForward, t)) {
    std::printf("%s unavailable: %s\n", dn.c_str(), ops::cpu::dnnl_gemm_info(t).c_str());
    return;
  }
  std::printf("oneDNN kernel: %s\n", ops::cpu::dnnl_gemm_info(t).c_str());
  std::printf("%-30s %9s %9s %9s %9s %9s %9s %8s\n", "shape (N x C -> OC)", "fwd sg", "fwd dnn", "dinp sg",
              "dinp dnn", "dW sg", "dW dnn", "dnn/sg");
  struct Shape {
    int N, C, OC;
    const char* what;
  };
  const Shape shapes[] = {
      {1024, 768, 2304, "attn qkv"},
      {1024, 768, 768, "attn proj"},
      {1024, 768, 3072, "mlp fc"},
      {1024, 3072, 768, "mlp proj"},
      {256, 768, 50304, "lm head (N=256)"},
      {256, 768, 2304, "attn qkv (N=256)"},
      {256, 768, 3072, "mlp fc (N=256)"},
      {256, 3072, 768, "mlp proj (N=256)"},
  };
  const int reps = std::max(2, g_reps / 2);
  for (const Shape& s : shapes) {
    const size_t nx = static_cast<size_t>(s.N) * s.C, nw = static_cast<size_t>(s.OC) * s.C,
                 ny = static_cast<size_t>(s.N) * s.OC;
    const auto x16 = randn16(t, nx, 1), w16 = randn16(t, nw, 2, 0.02f), dy16 = randn16(t, ny, 4);
    std::vector<float> x(nx), w(nw), dy(ny), out(ny), dinp(nx), dw(nw);
    const double flops = 2.0 * s.N * s.C * s.OC;
    const double fs = best_time([&] {
      ops::to_f32(x.data(), x16.data(), t, static_cast<int64_t>(nx));
      ops::to_f32(w.data(), w16.data(), t, static_cast<int64_t>(nw));
      be.run(ops::k::MatmulForward(out.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC));
    }, reps);
    const double fd = best_time([&] { be.run(ops::k::MatmulForward(out.data(), x16.data(), w16.data(), nullptr, s.N, s.C, s.OC), t); }, reps);
    const double is = best_time([&] {
      ops::to_f32(dy.data(), dy16.data(), t, static_cast<int64_t>(ny));
      ops::to_f32(w.data(), w16.data(), t, static_cast<int64_t>(nw));
      be.run(ops::k::MatmulBackward(dinp.data(), nullptr, nullptr, dy.data(), x.data(), w.data(), s.N, s.C, s.OC));
    }, reps);
    const double id = best_time([&] {
      be.run(ops::k::MatmulBackward(dinp.data(), nullptr, nullptr, dy16.data(), x16.data(), w16.data(), s.N, s.C, s.OC), t);
    }, reps);
    const double ws = best_time([&] {
      ops::to_f32(dy.data(), dy16.data(), t, static_cast<int64_t>(ny));
      ops::to_f32(x.data(), x16.data(), t, static_cast<int64_t>(nx));
      be.run(ops::k::MatmulBackward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), s.N, s.C, s.OC));
    }, reps);
    const double wd = best_time([&] {
      be.run(ops::k::MatmulBackward(nullptr, dw.data(), nullptr, dy16.data(), x16.data(), w16.data(), s.N, s.C, s.OC), t);
    }, reps);
    char name[64];
    std::snprintf(name, sizeof name, "%d x %d -> %d", s.N, s.C, s.OC);
    auto g = [&](double sec) { return flops / sec * 1e-9; };
    std::printf("%-30s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.2fx   %s\n", name, g(fs), g(fd), g(is), g(id), g(ws),
                g(wd), (fs + is + ws) / (fd + id + wd), s.what);
  }
  const ops::GemmPaths p = ops::choose_gemm_paths(ops::GemmMode::Auto);
  std::printf("chooser (start-up probe %d x %d -> %d): %s\n", p.probe_N, p.probe_C, p.probe_OC,
              p.of(t).summary().c_str());
}

// What the thread-count independence costs the 16-bit weight gradient: Backend::
// matmul16_backward's dW (dnnl_dweight_fixed: fixed tiles, one thread inside each) against one
// oneDNN call on the whole team (oneDNN's own split along the rows, whose sums depend on the
// thread count: what ran before the fixed blocking). Per shape, then per training step of
// bench/train_vs_torch.py's two configurations (each Linear's dW once per micro-batch), and a
// last line of JSON for bench/thread_cost.py --dweight.
void bench_dweight(ops::Backend& be, ops::DType t) {
  std::printf("\n== 16-bit weight gradient (%s): fixed tiles vs oneDNN's own split, ms ==\n", ops::dtype_name(t));
  if (!be.has(ops::Kernel::MatmulForward, t)) {
    std::printf("oneDNN unavailable: %s\n", ops::cpu::dnnl_gemm_info(t).c_str());
    return;
  }
  struct Shape {
    int N, C, OC, per_step;
    const char* what;
  };
  struct Config {
    const char* name;
    std::vector<Shape> shapes;
  };
  // small: vocab 256, d 384, 6 layers, batch 8 x seq 256; gpt2: vocab 50257, d 768, 12 layers, batch 4 x seq 64.
  const Config configs[] = {
      {"small", {{2048, 384, 1152, 6, "qkv"}, {2048, 384, 384, 6, "attn proj"}, {2048, 384, 1536, 6, "mlp fc"},
                 {2048, 1536, 384, 6, "mlp proj"}, {2048, 384, 256, 1, "lm head"}}},
      {"gpt2", {{256, 768, 2304, 12, "qkv"}, {256, 768, 768, 12, "attn proj"}, {256, 768, 3072, 12, "mlp fc"},
                {256, 3072, 768, 12, "mlp proj"}, {256, 768, 50257, 1, "lm head"}}},
  };
  const int reps = std::max(3, g_reps);
  std::printf("%-8s %-10s %-22s %10s %10s %7s\n", "config", "layer", "N x C -> OC", "fixed", "split", "ratio");
  std::string json = "{";
  for (const Config& cfg : configs) {
    double fixed_step = 0, split_step = 0;
    for (const Shape& s : cfg.shapes) {
      const size_t nx = static_cast<size_t>(s.N) * s.C, nw = static_cast<size_t>(s.OC) * s.C,
                   ny = static_cast<size_t>(s.N) * s.OC;
      const auto x16 = randn16(t, nx, 1), w16 = randn16(t, nw, 2, 0.02f), dy16 = randn16(t, ny, 4);
      std::vector<float> dw(nw, 0.0f);
      double fixed = 1e30, split = 1e30;
      for (int r = 0; r < reps; ++r) {  // alternated, so that the machine's noise hits both alike
        fixed = std::min(fixed, best_time([&] {
          be.run(ops::k::MatmulBackward(nullptr, dw.data(), nullptr, dy16.data(), x16.data(), w16.data(), s.N, s.C, s.OC), t);
        }, 1));
        split = std::min(split, best_time([&] {
          ops::cpu::dnnl_gemm(t, true, false, s.OC, s.C, s.N, dy16.data(), s.OC, x16.data(), s.C, nullptr, true,
                              dw.data(), s.C);
        }, 1));
      }
      char shape[48];
      std::snprintf(shape, sizeof shape, "%d x %d -> %d", s.N, s.C, s.OC);
      std::printf("%-8s %-10s %-22s %10.3f %10.3f %6.2fx\n", cfg.name, s.what, shape, fixed * 1e3, split * 1e3,
                  fixed / split);
      fixed_step += s.per_step * fixed;
      split_step += s.per_step * split;
    }
    std::printf("%-8s %-10s %-22s %10.3f %10.3f %6.2fx   per step: +%.2f ms\n", cfg.name, "step", "(all Linears)",
                fixed_step * 1e3, split_step * 1e3, fixed_step / split_step, (fixed_step - split_step) * 1e3);
    char item[128];
    std::snprintf(item, sizeof item, "%s\"%s\": {\"fixed_ms\": %.4f, \"split_ms\": %.4f}", json.size() > 1 ? ", " : "",
                  cfg.name, fixed_step * 1e3, split_step * 1e3);
    json += item;
  }
  std::printf("DWEIGHT_JSON %s}\n", json.c_str());
}

// Attention forward/backward at one shape, for each block-row size. `saved` floats per
// (b, h) of what the forward keeps for the backward (T*T probabilities in a kernel that stores them, T
// log-sum-exps in the flash-style ones).
void bench_attention(ops::Backend& be, int B, int T, int C, int NH, std::initializer_list<int> blocks) {
  const int HS = C / NH;
  std::printf("\n== attention B=%d T=%d C=%d NH=%d (causal) ==\n", B, T, C, NH);
  const auto qkv = randn(static_cast<size_t>(B) * T * 3 * C, 5, 0.5f), dout = randn(static_cast<size_t>(B) * T * C, 6);
  std::vector<float> out(static_cast<size_t>(B) * T * C), saved(static_cast<size_t>(B) * NH * ATTN_SAVED(T)),
      dqkv(qkv.size());
  // Useful (causal) flops: QK^T and PV over the lower triangle forward; four such products backward.
  const double tri = static_cast<double>(T) * (T + 1) / 2;
  const double fwd_flops = 2.0 * 2 * B * NH * tri * HS, bwd_flops = 2.0 * fwd_flops;
  const int rows = ops::cpu::attention_block_rows();
  std::printf("%-12s %10s %10s %10s %10s %12s %12s\n", "block rows", "fwd ms", "bwd ms", "fwd p=0.1", "bwd p=0.1",
              "fwd GFLOP/s", "f+b GFLOP/s");
  for (int block : blocks) {
    ops::cpu::set_attention_block_rows(block);
    const double tf = best_time([&] { be.run(ops::k::AttentionForward(out.data(), saved.data(), qkv.data(), B, T, C, NH, {})); });
    const double tb = best_time([&] {
      be.run(ops::k::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), saved.data(), B, T, C, NH, {}));
    });
    const ops::DropoutSpec drop{0.1f, 42};
    const double tfd = best_time([&] { be.run(ops::k::AttentionForward(out.data(), saved.data(), qkv.data(), B, T, C, NH, drop)); });
    const double tbd = best_time([&] {
      be.run(ops::k::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), saved.data(), B, T, C, NH, drop));
    });
    std::printf("%-12d %10.3f %10.3f %10.3f %10.3f %12.1f %12.1f\n", block, tf * 1e3, tb * 1e3, tfd * 1e3, tbd * 1e3,
                fwd_flops / tf * 1e-9, (fwd_flops + bwd_flops) / (tf + tb) * 1e-9);
  }
  ops::cpu::set_attention_block_rows(rows);
}

void bench_pointwise(ops::Backend& be) {
  std::printf("\n== pointwise and reductions ==\n");
  const int N = 2048, C = 384, H = 4 * C;
  const auto x = randn(static_cast<size_t>(N) * C, 7), w = randn(C, 8), b = randn(C, 9),
             dy = randn(static_cast<size_t>(N) * C, 10);
  std::vector<float> out(x.size()), mean(N), rstd(N), dx(x.size()), dw(C), db(C);
  auto row = [](const char* name, double t, double bytes) {
    std::printf("%-44s %9.3f ms %8.1f GB/s\n", name, t * 1e3, bytes / t * 1e-9);
  };
  const double nc = static_cast<double>(N) * C * 4;
  row("layernorm fwd (2048 x 384)",
      best_time([&] { be.run(ops::k::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f)); }),
      2 * nc);
  row("layernorm bwd (2048 x 384)", best_time([&] {
        be.run(ops::k::LayerNormBackward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                              N, C));
      }),
      4 * nc);
  const auto h = randn(static_cast<size_t>(N) * H, 11, 2.0f), dh = randn(h.size(), 12);
  std::vector<float> ho(h.size()), dhi(h.size());
  const double nh = static_cast<double>(N) * H * 4;
  row("gelu fwd (2048 x 1536)", best_time([&] { be.run(ops::k::GeluForward(ho.data(), h.data(), static_cast<int64_t>(h.size()))); }),
      2 * nh);
  row("gelu bwd (2048 x 1536)",
      best_time([&] { be.run(ops::k::GeluBackward(dhi.data(), h.data(), dh.data(), static_cast<int64_t>(h.size()))); }), 3 * nh);
  // The exact-libm alternative, for comparison: scalar tanhf, single thread.
  row("  gelu fwd with libm tanhf (1 thread)", best_time([&] {
        const float k = 0.7978845608f;
        for (size_t i = 0; i < h.size(); i++) {
          const float v = h[i];
          ho[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
        }
      }),
      2 * nh);
  row("add_inplace (2048 x 1536)",
      best_time([&] { be.run(ops::k::AddInplace(dhi.data(), dh.data(), static_cast<int64_t>(h.size()))); }), 3 * nh);
  row("dropout fwd p=0.1 (2048 x 384)",
      best_time([&] { be.run(ops::k::DropoutForward(out.data(), x.data(), static_cast<int64_t>(x.size()), {0.1f, 3})); }), 2 * nc);

  const int NV = 256, V = 50304, Vreal = 50257;
  const auto logits = randn(static_cast<size_t>(NV) * V, 13, 2.0f);
  std::vector<float> probs(logits.size()), losses(NV);
  std::vector<int32_t> tgt(NV);
  for (int i = 0; i < NV; i++) tgt[i] = (i * 7919) % Vreal;
  const double nv = static_cast<double>(NV) * V * 4;
  row("softmax_xent fwd (256 x 50304)", best_time([&] {
        be.run(ops::k::SoftmaxXentForward(losses.data(), probs.data(), logits.data(), tgt.data(), NV, V, Vreal));
      }),
      2 * nv);
  row("softmax_xent bwd (256 x 50304, in place)", best_time([&] {
        be.run(ops::k::SoftmaxXentBackward(probs.data(), probs.data(), tgt.data(), 1.0f / NV, NV, V, Vreal));
      }),
      2 * nv);

  const int64_t np = 30'000'000;  // ~ a 30M-parameter model
  auto p = randn(np, 14, 0.02f), g = randn(np, 15, 1e-3f);
  std::vector<float> m(np, 0.0f), v(np, 0.0f);
  int64_t t = 1;
  row("adamw (30M params)", best_time([&] {
        be.run(ops::k::AdamwUpdate(p.data(), g.data(), m.data(), v.data(), np, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t++, 1.0f));
      }, 3),
      7.0 * np * 4);
  double sink = 0;
  row("sum_squares (30M)", best_time([&] { sink += ops::sum_squares(be, g.data(), np); }, 3), 1.0 * np * 4);
  if (sink < 0) std::printf("%g\n", sink);
}

// Each memory-bound operator three ways, GPT-2 124M's widths (C 768, 4C)
// at N = 2048 rows: in bf16 (or fp16) as the executor's widened path runs it (the 16-bit
// inputs converted to fp32 copies, the fp32 kernel, the output rounded back; a backward's
// gradient computed into a zeroed fp32 copy and accumulated into the 16-bit one), through
// the 16-bit-native kernel (Backend::*16), and in fp32. Ratios < 1 mean native is faster.
struct Native16Row {
  double widened = 0, native = 0, fp32 = 0;
};
void native16_row(const char* name, const Native16Row& r, Native16Row& sum) {
  std::printf("%-26s %9.3f %9.3f %9.3f   %6.2fx %6.2fx\n", name, r.widened * 1e3, r.native * 1e3, r.fp32 * 1e3,
              r.native / r.widened, r.native / r.fp32);
  sum.widened += r.widened;
  sum.native += r.native;
  sum.fp32 += r.fp32;
}

void bench_native16(ops::Backend& be, ops::DType t) {
  using ops::DType;
  std::printf("\n== memory-bound operators in %s: widened vs native vs fp32 (ms; native/widened, native/fp32) ==\n",
              ops::dtype_name(t));
  const int N = 2048, C = 768, H = 4 * C;
  const int64_t nc = int64_t{N} * C, nh = int64_t{N} * H, n2h = 2 * nh;
  const auto x32 = randn(n2h, 1), y32 = randn(n2h, 2), w = randn(C, 3), b = randn(C, 4);
  const auto x16 = randn16(t, n2h, 1), y16 = randn16(t, n2h, 2);
  std::vector<float> wa(n2h), wb(n2h), wo(n2h), f32o(n2h), mean(N), rstd(N), dw(C, 0.0f), db(C, 0.0f);
  std::vector<uint16_t> o16(n2h), d16(n2h, 0);
  auto cv_in = [&](std::vector<float>& dst, const std::vector<uint16_t>& src, int64_t n) {
    be.run(ops::k::Convert(dst.data(), DType::F32, src.data(), t, n));
  };
  auto out16 = [&](int64_t n) { be.run(ops::k::Convert(o16.data(), t, wo.data(), DType::F32, n)); };
  auto acc16 = [&](int64_t n) {
    be.run(ops::k::Accumulate(d16.data(), t, wo.data(), n));
  };
  auto zero = [&](int64_t n) { std::memset(wo.data(), 0, sizeof(float) * n); };
  std::printf("%-26s %9s %9s %9s   %7s %7s\n", "operator", "widened", "native", "fp32", "n/w", "n/fp32");
  Native16Row sum, r;
  r = {best_time([&] { cv_in(wa, x16, nc); be.run(ops::k::LayerNormForward(wo.data(), mean.data(), rstd.data(), wa.data(), w.data(), b.data(), N, C, 1e-5f)); out16(nc); }),
       best_time([&] { be.run(ops::k::LayerNormForward(o16.data(), mean.data(), rstd.data(), x16.data(), w.data(), b.data(), N, C, 1e-5f), t); }),
       best_time([&] { be.run(ops::k::LayerNormForward(f32o.data(), mean.data(), rstd.data(), x32.data(), w.data(), b.data(), N, C, 1e-5f)); })};
  native16_row("layernorm fwd", r, sum);
  r = {best_time([&] { cv_in(wa, x16, nc); cv_in(wb, y16, nc); zero(nc); be.run(ops::k::LayerNormBackward(wo.data(), dw.data(), db.data(), wb.data(), wa.data(), w.data(), mean.data(), rstd.data(), N, C)); acc16(nc); }),
       best_time([&] { be.run(ops::k::LayerNormBackward(d16.data(), dw.data(), db.data(), y16.data(), x16.data(), w.data(), mean.data(), rstd.data(), N, C), t); }),
       best_time([&] { be.run(ops::k::LayerNormBackward(f32o.data(), dw.data(), db.data(), y32.data(), x32.data(), w.data(), mean.data(), rstd.data(), N, C)); })};
  native16_row("layernorm bwd", r, sum);
  r = {best_time([&] { cv_in(wa, x16, nc); be.run(ops::k::RmsNormForward(wo.data(), rstd.data(), wa.data(), w.data(), N, C, 1e-5f)); out16(nc); }),
       best_time([&] { be.run(ops::k::RmsNormForward(o16.data(), rstd.data(), x16.data(), w.data(), N, C, 1e-5f), t); }),
       best_time([&] { be.run(ops::k::RmsNormForward(f32o.data(), rstd.data(), x32.data(), w.data(), N, C, 1e-5f)); })};
  native16_row("rmsnorm fwd", r, sum);
  r = {best_time([&] { cv_in(wa, x16, nh); be.run(ops::k::GeluForward(wo.data(), wa.data(), nh)); out16(nh); }),
       best_time([&] { be.run(ops::k::GeluForward(o16.data(), x16.data(), nh), t); }),
       best_time([&] { be.run(ops::k::GeluForward(f32o.data(), x32.data(), nh)); })};
  native16_row("gelu fwd (N x 4C)", r, sum);
  r = {best_time([&] { cv_in(wa, x16, nh); cv_in(wb, y16, nh); zero(nh); be.run(ops::k::GeluBackward(wo.data(), wa.data(), wb.data(), nh)); acc16(nh); }),
       best_time([&] { be.run(ops::k::GeluBackward(d16.data(), x16.data(), y16.data(), nh), t); }),
       best_time([&] { be.run(ops::k::GeluBackward(f32o.data(), x32.data(), y32.data(), nh)); })};
  native16_row("gelu bwd (N x 4C)", r, sum);
  r = {best_time([&] { cv_in(wa, x16, n2h); be.run(ops::k::SwigluForward(wo.data(), wa.data(), N, H)); out16(nh); }),
       best_time([&] { be.run(ops::k::SwigluForward(o16.data(), x16.data(), N, H), t); }),
       best_time([&] { be.run(ops::k::SwigluForward(f32o.data(), x32.data(), N, H)); })};
  native16_row("swiglu fwd (N x 2x4C)", r, sum);
  r = {best_time([&] { cv_in(wa, x16, nc); cv_in(wb, y16, nc); be.run(ops::k::AddForward(wo.data(), wa.data(), wb.data(), nc)); out16(nc); }),
       best_time([&] { be.run(ops::k::AddForward(o16.data(), x16.data(), y16.data(), nc), t); }),
       best_time([&] { be.run(ops::k::AddForward(f32o.data(), x32.data(), y32.data(), nc)); })};
  native16_row("add (residual)", r, sum);
  r = {best_time([&] { cv_in(wb, y16, nc); zero(nc); be.run(ops::k::AddInplace(wo.data(), wb.data(), nc)); acc16(nc); }),
       best_time([&] { be.run(ops::k::AddInplace(d16.data(), y16.data(), nc), t); }),
       best_time([&] { be.run(ops::k::AddInplace(f32o.data(), y32.data(), nc)); })};
  native16_row("add bwd (one input)", r, sum);
  const ops::DropoutSpec drop{0.1f, 3};
  r = {best_time([&] { cv_in(wa, x16, nc); be.run(ops::k::DropoutForward(wo.data(), wa.data(), nc, drop)); out16(nc); }),
       best_time([&] { be.run(ops::k::DropoutForward(o16.data(), x16.data(), nc, drop), t); }),
       best_time([&] { be.run(ops::k::DropoutForward(f32o.data(), x32.data(), nc, drop)); })};
  native16_row("dropout fwd p=0.1", r, sum);
  const int B = 8, T = N / B, NH = 12;
  const int64_t nq = int64_t{N} * 3 * C;
  r = {best_time([&] { cv_in(wa, x16, nq); be.run(ops::k::RopeForward(wo.data(), wa.data(), B, T, C, NH, 10000.0f)); out16(nq); }),
       best_time([&] { be.run(ops::k::RopeForward(o16.data(), x16.data(), B, T, C, NH, 10000.0f), t); }),
       best_time([&] { be.run(ops::k::RopeForward(f32o.data(), x32.data(), B, T, C, NH, 10000.0f)); })};
  native16_row("rope fwd (N x 3C)", r, sum);
  native16_row("total", sum, sum);
}

// The attention three ways at GPT-2's heads (B 4, T 256, 12 heads of 64): the
// widened path (qkv and dout converted to fp32 copies, out rounded back, dqkv computed into a
// zeroed fp32 copy and accumulated), the native kernels (Backend::attention_*16), and fp32.
void bench_native16_attention(ops::Backend& be, ops::DType t) {
  using ops::DType;
  const int B = 4, T = 256, C = 768, NH = 12, W = 3 * C;
  const int64_t nq = int64_t{B} * T * W, nc = int64_t{B} * T * C;
  std::printf("\n== attention in %s (B %d, T %d, %d heads of %d): widened vs native vs fp32 (ms) ==\n",
              ops::dtype_name(t), B, T, NH, C / NH);
  std::printf("%-26s %9s %9s %9s   %7s %7s\n", "operator", "widened", "native", "fp32", "n/w", "n/fp32");
  const auto q32 = randn(nq, 5, 0.5f), d32 = randn(nc, 6);
  const auto q16 = randn16(t, nq, 5, 0.5f), d16in = randn16(t, nc, 6);
  std::vector<float> qw(nq), dw(nc), ow(nc), o32(nc), lse(int64_t{B} * NH * T), g(nq), g32(nq, 0.0f);
  std::vector<uint16_t> o16(nc), dq16(nq, 0);
  const ops::DropoutSpec drop{};
  Native16Row sum, r;
  r = {best_time([&] {
         be.run(ops::k::Convert(qw.data(), DType::F32, q16.data(), t, nq));
         be.run(ops::k::AttentionForward(ow.data(), lse.data(), qw.data(), B, T, C, NH, drop));
         be.run(ops::k::Convert(o16.data(), t, ow.data(), DType::F32, nc));
       }),
       best_time([&] { be.run(ops::k::AttentionForward(o16.data(), lse.data(), q16.data(), B, T, C, NH, drop), t); }),
       best_time([&] { be.run(ops::k::AttentionForward(o32.data(), lse.data(), q32.data(), B, T, C, NH, drop)); })};
  native16_row("attention fwd", r, sum);
  r = {best_time([&] {
         be.run(ops::k::Convert(qw.data(), DType::F32, q16.data(), t, nq));
         be.run(ops::k::Convert(dw.data(), DType::F32, d16in.data(), t, nc));
         std::memset(g.data(), 0, sizeof(float) * nq);
         be.run(ops::k::AttentionBackward(g.data(), dw.data(), qw.data(), lse.data(), B, T, C, NH, drop, nullptr));
         be.run(ops::k::Accumulate(dq16.data(), t, g.data(), nq));
       }),
       best_time([&] {
         be.run(ops::k::AttentionBackward(dq16.data(), d16in.data(), q16.data(), lse.data(), B, T, C, NH, drop, nullptr), t);
       }),
       best_time([&] { be.run(ops::k::AttentionBackward(g32.data(), d32.data(), q32.data(), lse.data(), B, T, C, NH, drop, nullptr)); })};
  native16_row("attention bwd", r, sum);
  native16_row("total", sum, sum);
}

}  // namespace

int main(int argc, char** argv) {
  bool attention_only = false, native16_only = false, gemm16_only = false, dweight_only = false;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--quick") == 0) g_reps = 2;
    if (std::strcmp(argv[i], "--attention") == 0) attention_only = true;
    if (std::strcmp(argv[i], "--native16") == 0) native16_only = true;
    if (std::strcmp(argv[i], "--gemm16") == 0) gemm16_only = true;
    if (std::strcmp(argv[i], "--dweight") == 0) dweight_only = true;
  }
  ops::Backend& be = ops::cpu_backend();
  std::printf("backend %s, OpenMP threads %d, OpenBLAS threads %d, %s\n", be.name(), ops::num_threads(),
              openblas_get_num_threads(), openblas_get_config());
  if (gemm16_only) {
    bench_gemm16(be, ops::DType::BF16);
    return 0;
  }
  if (dweight_only) {
    bench_dweight(be, ops::DType::BF16);
    return 0;
  }
  if (native16_only) {
    bench_native16(be, ops::DType::BF16);
    bench_native16(be, ops::DType::F16);
    bench_native16_attention(be, ops::DType::BF16);
    bench_native16_attention(be, ops::DType::F16);
    return 0;
  }
  if (!attention_only) {
    bench_gemm(be);
    bench_gemm16(be, ops::DType::BF16);
    bench_gemm16(be, ops::DType::F16);
  }
  bench_attention(be, 8, 256, 384, 6, {32, 64, 128, 256});
  // GPT-2 small's heads (C 768, 12 heads of 64) at T = 256 and 1024.
  bench_attention(be, 4, 256, 768, 12, {64});
  bench_attention(be, 1, 1024, 768, 12, {64});
  if (!attention_only) bench_pointwise(be);
  return 0;
}
