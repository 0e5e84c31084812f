// The loss scaler and the gradient range report (see precision.h).
#include "runner/train/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "ops/convert.h"
#include "runner/train/rank_model.h"

namespace runner {

LossScaler::LossScaler(const PrecisionConfig& p)
    : cfg_(p.loss_scale),
      active_(p.compute == FloatFormat::fp16 && p.loss_scale.mode != LossScaleMode::none),
      dynamic_(active_ && p.loss_scale.mode == LossScaleMode::dynamic) {}

bool LossScaler::update(LossScalerState& s, bool finite) const {
  if (finite) {
    s.consecutive_skips = 0;
    if (!dynamic_) return true;
    if (++s.good_steps >= cfg_.growth_interval) {
      s.scale *= cfg_.growth_factor;
      s.good_steps = 0;
    }
    return true;
  }
  s.skipped_steps++;
  s.consecutive_skips++;
  s.good_steps = 0;
  if (dynamic_) s.scale = std::max(cfg_.min_scale, s.scale * cfg_.backoff_factor);
  return false;
}

namespace {

// Exponent bins of the unscaled |gradient|: 2^-150 (below fp32's smallest subnormal) .. 2^40.
constexpr int kMinExp = -150, kBins = 190;
// Per tensor: numel, zeros, nonfinite, underflow, then the bins' squared sums (the gradient's
// energy by exponent).
constexpr int kHead = 4, kStride = kHead + kBins;
constexpr int64_t kPiece = 1 << 14;
// A scale suits a tensor when what it flushes to zero is at most 1% of the tensor's gradient
// norm (1e-4 of its squared norm). By norm, not by count: elements whose gradient is
// analytically zero hold pure rounding noise (e.g. the key slice of the qkv bias), and counting
// them would demand absurd scales for nothing.
constexpr double kFlushNormShare = 0.01;

// This rank's share of every logical tensor's histogram (acc, kStride per table entry) and
// largest scaled |gradient| (mx): the elements it owns, each counted once over the grid.
//
// The report is a diagnosis (the logged steps of precision.diagnostics, and an fp16 overflow), not
// every step's work: each owned gradient range crosses out to the host whole (the named crossing;
// a plain host buffer, outside the ledger's accounts) and is binned there.
void local_histograms(const RankModel& model, const ParamSet& ps, const ModelLayout& layout, double scale,
                      std::vector<double>& acc, std::vector<float>& mx) {
  float buf[kPiece];
  std::vector<float> host;  // floats: aligned for an fp32 gradient, twice the room for a 16-bit one
  for (size_t i = 0; i < ps.grads.size(); ++i) {
    if (!model.counts(i)) continue;
    const int k = layout.find(ps.names[i]);
    if (k < 0) continue;
    double* h = acc.data() + static_cast<size_t>(k) * kStride;
    const ops::Tensor& g = ps.grads[i];
    auto [a, e] = ps.owned_range(i);
    float m = 0;
    const size_t es = ops::dtype_size(g.dtype());
    host.resize(static_cast<size_t>(std::max<int64_t>(0, e - a)));
    if (e > a) g.view(a, {e - a}).read_to_host(host.data());
    for (int64_t p = a; p < e; p += kPiece) {
      const int64_t n = std::min(kPiece, e - p);
      const float* x = host.data() + (p - a);
      if (g.dtype() != ops::DType::F32) {
        ops::to_f32(buf, reinterpret_cast<const char*>(host.data()) + static_cast<size_t>(p - a) * es, g.dtype(), n);
        x = buf;
      }
      for (int64_t j = 0; j < n; ++j) {
        const float v = x[j];
        if (!std::isfinite(v)) { h[2] += 1; continue; }
        if (v == 0.0f) { h[1] += 1; continue; }
        const double av = std::fabs(static_cast<double>(v));
        m = std::max(m, static_cast<float>(av));
        if (av < kF16MinSubnormal) h[3] += 1;  // the gradient is already scaled
        const double ag = av / scale;
        const int ex = std::clamp(std::ilogb(ag) - kMinExp, 0, kBins - 1);
        h[kHead + ex] += ag * ag;
      }
    }
    h[0] += static_cast<double>(e - a);
    mx[static_cast<size_t>(k)] = std::max(mx[static_cast<size_t>(k)], m);
  }
}

// One tensor's range from its summed histogram `h` and its largest scaled |gradient| `mx`.
GradRange range_of(const LogicalParam& entry, const double* h, float mx, double scale) {
  GradRange t;
  t.name = entry.name;
  t.layer = entry.desc.layer;
  t.numel = static_cast<int64_t>(h[0]);
  t.zeros = static_cast<int64_t>(h[1]);
  t.nonfinite = static_cast<int64_t>(h[2]);
  t.max_abs = static_cast<double>(mx) / scale;
  double energy = 0;
  for (int b = 0; b < kBins; ++b) energy += h[kHead + b];
  t.underflow = h[0] > 0 ? h[3] / h[0] : 0.0;
  t.headroom_bits = t.max_abs > 0 ? std::log2(kF16Max / (t.max_abs * scale)) : std::numeric_limits<double>::infinity();
  t.scale_hi = t.max_abs > 0 ? kF16Max / t.max_abs : std::numeric_limits<double>::infinity();
  t.scale_lo = 0;
  if (energy > 0) {  // the exponent below which at most 1% of the norm lies
    double cum = 0;
    for (int b = 0; b < kBins; ++b) {
      cum += h[kHead + b];
      if (cum > kFlushNormShare * kFlushNormShare * energy) {
        t.scale_lo = kF16MinSubnormal / std::ldexp(1.0, b + kMinExp);
        break;
      }
    }
  }
  return t;
}

// When no single scale suits every tensor: the one needing the largest scale and the one
// allowing the smallest.
void find_conflict(GradReport& r) {
  int lo = -1, hi = -1;
  for (size_t k = 0; k < r.tensors.size(); ++k) {
    const GradRange& t = r.tensors[k];
    if (t.numel == t.zeros + t.nonfinite) continue;
    if (lo < 0 || t.scale_lo > r.tensors[static_cast<size_t>(lo)].scale_lo) lo = static_cast<int>(k);
    if (hi < 0 || t.scale_hi < r.tensors[static_cast<size_t>(hi)].scale_hi) hi = static_cast<int>(k);
  }
  if (lo >= 0 && hi >= 0 && lo != hi && r.tensors[static_cast<size_t>(lo)].scale_lo > r.tensors[static_cast<size_t>(hi)].scale_hi) {
    r.needs_large = lo;
    r.needs_small = hi;
  }
}

}  // namespace

GradReport grad_report(ops::Backend& be, const RankModel& model, const ParamSet& ps, const ModelLayout& layout,
                       parallel::Grid& grid, double scale) {
  (void)be;
  const auto& table = layout.params();
  const size_t P = table.size();
  std::vector<double> acc(P * kStride, 0.0);
  std::vector<float> mx(P, 0.0f);
  local_histograms(model, ps, layout, scale, acc, mx);
  grid.world().allreduce_sum(acc.data(), static_cast<int64_t>(acc.size()));
  grid.world().allreduce_max(mx.data(), static_cast<int64_t>(mx.size()));

  GradReport r;
  r.scale = scale;
  int best_bwd = -1;
  // The output layer's weight (the last vocabulary-row parameter: the tied embedding, or the
  // untied head) is the first gradient the backward produces.
  int head = -1;
  for (size_t k = 0; k < P; ++k)
    if (table[k].vocab_rows) head = static_cast<int>(k);
  for (size_t k = 0; k < P; ++k) {
    GradRange t = range_of(table[k], acc.data() + k * kStride, mx[k], scale);
    // Backward order: the reverse of the table's (forward) order, the output layer first.
    if (t.nonfinite > 0) {
      const int bwd = static_cast<int>(k) == head ? static_cast<int>(P) : static_cast<int>(k);
      if (bwd > best_bwd) {
        best_bwd = bwd;
        r.first_nonfinite = static_cast<int>(k);
      }
    }
    r.tensors.push_back(std::move(t));
  }
  find_conflict(r);
  return r;
}

}  // namespace runner
