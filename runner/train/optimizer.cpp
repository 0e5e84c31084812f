// AdamW policy: schedule, clipping, decay groups (see optimizer.h).
#include "runner/train/optimizer.h"

#include <cmath>

namespace runner {

double lr_at(const OptimizerConfig& o, int64_t step, int64_t total_steps) {
  const ScheduleConfig& s = o.schedule;
  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.kind == LrSchedule::constant) return o.lr;
  double min_lr = s.min_lr_ratio * o.lr;
  int64_t span = std::max<int64_t>(1, total_steps - s.warmup_steps - 1);
  double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(span));
  if (s.kind == LrSchedule::linear) return o.lr - (o.lr - min_lr) * progress;
  return min_lr + (o.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));  // cosine
}

double grad_norm(ops::Backend& be, const ParamSet& ps) {
  double ss = 0;
  for (auto& g : ps.grads) ss += be.sum_squares(g.data<float>(), g.numel());
  return std::sqrt(ss);
}

double clip_factor(double norm, double clip) {
  if (clip <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, clip / (norm + 1e-6));
}

void adamw_step(ops::Backend& be, const OptimizerConfig& o, TrainState& st, double lr, double grad_scale) {
  ParamSet& ps = st.params;
  if (st.adam_m.size() != ps.values.size()) {
    st.adam_m.clear();
    st.adam_v.clear();
    for (size_t i = 0; i < ps.values.size(); ++i) {
      auto shape = moment_shape(ps, i);
      st.adam_m.emplace_back(shape, ops::DType::F32, ops::Account::Optimizer);
      st.adam_v.emplace_back(shape, ops::DType::F32, ops::Account::Optimizer);
    }
  }
  for (size_t i = 0; i < ps.values.size(); ++i) {
    auto [a, e] = ps.owned_range(i);
    if (e <= a) continue;
    be.adamw_update(ps.values[i].data<float>() + a, ps.grads[i].data<float>() + a, st.adam_m[i].data<float>(),
                    st.adam_v[i].data<float>(), e - a, static_cast<float>(lr),
                    static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps),
                    ps.decay[i] ? static_cast<float>(o.weight_decay) : 0.0f, st.step + 1,
                    static_cast<float>(grad_scale));
  }
}

std::vector<int64_t> moment_shape(const ParamSet& ps, size_t i) {
  auto [a, e] = ps.owned_range(i);
  if (a == 0 && e == ps.values[i].numel()) return ps.values[i].shape();
  return {e - a};
}

void zero_grads(ParamSet& ps) {
  for (auto& g : ps.grads) g.zero();
}

}  // namespace runner
