// The optimizer phase at GPT-2 124M's parameter shapes: the gradient
// norm's sum of squares, the AdamW update (with the 16-bit copy) and the gradient zeroing,
// timed the old way (the host defaults Backend::sum_squares_typed, Backend::adamw_update_typed
// and Backend::mem_zero, as the trainer called them before the fusion) and the new way (the
// CPU's threaded sum_squares_typed, then adamw_update_zero_grad: one pass). Run as
//   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE build/bench_optimizer [--reps N]
// Each number is the best of N repetitions (default 3) after one warm-up: the least noisy
// estimate on a shared machine.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"

namespace {

using ops::DType;
using Clock = std::chrono::steady_clock;

// GPT-2 124M's parameter tensors (V 50257, T 1024, C 768, 12 layers, MLP 4C), tied head.
std::vector<int64_t> gpt2_sizes() {
  const int64_t V = 50257, T = 1024, C = 768, L = 12;
  std::vector<int64_t> s = {V * C, T * C};
  for (int64_t l = 0; l < L; ++l)
    for (int64_t n : {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C}) s.push_back(n);
  s.push_back(C);
  s.push_back(C);
  return s;
}

// One run's optimizer state, every tensor in one allocation per kind (offsets per tensor).
struct Model {
  DType pt, gt;
  bool master;
  std::vector<int64_t> sizes, off;
  int64_t total = 0;
  std::vector<char> param, grad;
  std::vector<float> masters, m, v;
  Model(DType pt_, DType gt_, bool master_) : pt(pt_), gt(gt_), master(master_), sizes(gpt2_sizes()) {
    for (int64_t n : sizes) off.push_back(total), total += n;
    param.assign(static_cast<size_t>(total) * ops::dtype_size(pt), 0);
    grad.assign(static_cast<size_t>(total) * ops::dtype_size(gt), 0);
    if (master) masters.assign(static_cast<size_t>(total), 0.01f);
    m.assign(static_cast<size_t>(total), 0.0f);
    v.assign(static_cast<size_t>(total), 0.0f);
    fill_grad();
  }
  void fill_grad() {
    // A small nonzero gradient (re-filled before every timed step: the step zeroes it).
    std::vector<float> g(1 << 16);
    for (size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>((i * 7919) % 201) - 0.1f;
    const size_t es = ops::dtype_size(gt);
    for (int64_t a = 0; a < total; a += static_cast<int64_t>(g.size())) {
      const int64_t k = std::min<int64_t>(static_cast<int64_t>(g.size()), total - a);
      if (gt == DType::F32) std::memcpy(grad.data() + a * es, g.data(), static_cast<size_t>(k) * 4);
      else ops::from_f32(grad.data() + a * es, gt, g.data(), k);
    }
  }
  void* p(size_t i) { return param.data() + off[i] * ops::dtype_size(pt); }
  void* g(size_t i) { return grad.data() + off[i] * ops::dtype_size(gt); }
  float* w(size_t i) { return master ? masters.data() + off[i] : nullptr; }
};

struct Times {
  double norm = 0, update = 0, zero = 0;
  double total() const { return norm + update + zero; }
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One optimizer phase as the trainer runs it: the norm over every gradient, then the updates
// (and, old way, the separate zeroing). Gradient refill is outside the timing.
Times step(ops::Backend& be, Model& md, bool fused, int64_t t) {
  Times r;
  ops::Backend::AdamwArgs a;
  a.lr = 3e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay = 0.1f, a.t = t, a.grad_scale = 0.5f;
  double ss = 0;
  auto t0 = Clock::now();
  for (size_t i = 0; i < md.sizes.size(); ++i)
    ss += fused ? ops::sum_squares_typed(be, md.g(i), md.gt, md.sizes[i]) : [&] {
        double r = 0;
        ops::sum_squares_typed_composed(be, ops::k::SumSquaresTyped(md.g(i), md.gt, md.sizes[i], &r));
        return r;
      }();
  r.norm = seconds_since(t0);
  t0 = Clock::now();
  for (size_t i = 0; i < md.sizes.size(); ++i) {
    if (fused)
      be.run(ops::k::AdamwUpdateZeroGrad(md.p(i), md.pt, md.g(i), md.gt, md.w(i), md.m.data() + md.off[i], md.v.data() + md.off[i],
                                md.sizes[i], a));
    else
      ops::adamw_update_typed_composed(be, ops::k::AdamwUpdateTyped(md.p(i), md.pt, md.g(i), md.gt, md.w(i), md.m.data() + md.off[i],
                                     md.v.data() + md.off[i], md.sizes[i], a));
  }
  r.update = seconds_since(t0);
  if (!fused) {
    t0 = Clock::now();
    for (size_t i = 0; i < md.sizes.size(); ++i)
      be.Backend::mem_zero(md.g(i), static_cast<size_t>(md.sizes[i]) * ops::dtype_size(md.gt));
    r.zero = seconds_since(t0);
  }
  if (ss < 0) std::printf("%g\n", ss);  // keeps the norm from being optimised away
  return r;
}

Times best_of(ops::Backend& be, Model& md, bool fused, int reps) {
  Times best{1e30, 1e30, 1e30};
  double best_total = 1e30;
  for (int r = 0; r <= reps; ++r) {  // r == 0: warm-up
    md.fill_grad();
    const Times x = step(be, md, fused, r + 1);
    if (r > 0 && x.total() < best_total) best = x, best_total = x.total();
  }
  return best;
}

void report(ops::Backend& be, const char* what, DType pt, DType gt, bool master, int reps) {
  Model md(pt, gt, master);
  const Times o = best_of(be, md, false, reps), n = best_of(be, md, true, reps);
  std::printf("%-36s %8.1f %8.1f %8.1f %8.1f | %8.1f %8.1f %8.1f | %5.2fx\n", what, 1e3 * o.norm, 1e3 * o.update,
              1e3 * o.zero, 1e3 * o.total(), 1e3 * n.norm, 1e3 * n.update, 1e3 * n.total(), o.total() / n.total());
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  for (int i = 1; i + 1 < argc; i++)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  ops::Backend& be = ops::cpu_backend();
  int64_t total = 0;
  for (int64_t n : gpt2_sizes()) total += n;
  std::printf("optimizer phase, GPT-2 124M shapes (%lld parameters in %zu tensors), backend %s, %d threads, best of %d\n",
              static_cast<long long>(total), gpt2_sizes().size(), be.name(), ops::num_threads(), reps);
  std::printf("%-36s %8s %8s %8s %8s | %8s %8s %8s |\n", "ms", "old norm", "update", "zero", "total", "new norm",
              "upd+zero", "total");
  report(be, "fp32", DType::F32, DType::F32, false, reps);
  report(be, "bf16 + fp32 masters, fp32 grads", DType::BF16, DType::F32, true, reps);
  report(be, "bf16 + fp32 masters, bf16 grads", DType::BF16, DType::BF16, true, reps);
  return 0;
}
