// AdamW policy: schedule, clipping, decay groups (see optimizer.h).
#include "runner/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "runner/errors.h"

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

namespace {
// Element i of t: a pointer into its memory (the device's on a device: for backend calls only).
const char* at(const ops::Tensor& t, int64_t i) {
  return static_cast<const char*>(t.raw()) + static_cast<size_t>(i) * ops::dtype_size(t.dtype());
}
char* at(ops::Tensor& t, int64_t i) { return static_cast<char*>(t.raw()) + static_cast<size_t>(i) * ops::dtype_size(t.dtype()); }
}  // namespace

// A kernel that returns the number (a 16-bit tensor is widened on the device, in the pieces the
// host always used: Backend::sum_squares_typed).
double sum_squares(ops::Backend& be, const ops::Tensor& t, int64_t a, int64_t e) {
  if (e <= a) return 0;
  return ops::sum_squares_typed(be, at(t, a), t.dtype(), e - a);
}

double grad_norm(ops::Backend& be, const ParamSet& ps) {
  double ss = 0;
  for (auto& g : ps.grads) ss += sum_squares(be, g, 0, g.numel());
  return std::sqrt(ss);
}

bool keeps_masters(const PrecisionConfig& p) {
  return p.compute != FloatFormat::fp32 && p.master_weights == MasterWeights::fp32;
}

void init_masters(TrainState& st, const std::vector<ops::TensorDesc>& descs, const ModelConfig& m, uint64_t seed) {
  const ParamSet& ps = st.params;
  st.masters.clear();
  std::vector<float> full;
  for (size_t i = 0; i < ps.values.size(); ++i) {
    auto d = std::find_if(descs.begin(), descs.end(), [&](const ops::TensorDesc& x) { return x.name == ps.names[i]; });
    RUNNER_CHECK(d != descs.end(), "no desc for parameter " + ps.names[i]);
    full.resize(static_cast<size_t>(ps.values[i].numel()));
    init_param_values(*d, m, seed, full.data());
    auto [a, e] = ps.owned_range(i);
    st.masters.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer);
    RUNNER_CHECK(st.masters.back().numel() == std::max<int64_t>(0, e - a), "master of " + ps.names[i] + ": shape vs owned range");
    if (e > a) st.masters.back().write_from_host(full.data() + a);  // computed on the host, one crossing in
  }
}

double clip_factor(double norm, double clip) {
  if (clip <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, clip / (norm + 1e-6));
}

void adamw_step(ops::Backend& be, const OptimizerConfig& o, TrainState& st, double lr, double grad_scale,
                bool zero_grads) {
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
  const bool masters = !st.masters.empty();
  ops::Backend::AdamwArgs args;
  args.lr = static_cast<float>(lr);
  args.beta1 = static_cast<float>(o.beta1);
  args.beta2 = static_cast<float>(o.beta2);
  args.eps = static_cast<float>(o.eps);
  // Adam's step count t (its bias corrections 1 - beta^t) counts the updates applied, not the
  // steps taken: a step skipped for an fp16 overflow or a non-finite gradient updated nothing
  // (PyTorch's GradScaler does not call optimizer.step() then, nor does Megatron-LM advance its
  // count). skipped_steps is in every checkpoint, so t needs no field of its own.
  args.t = st.step + 1 - st.scaler.skipped_steps;
  args.grad_scale = static_cast<float>(grad_scale);
  for (size_t i = 0; i < ps.values.size(); ++i) {
    auto [a, e] = ps.owned_range(i);
    if (e <= a) continue;
    ops::Tensor& w = ps.values[i];
    ops::Tensor& g = ps.grads[i];
    args.weight_decay = ps.decay[i] ? static_cast<float>(o.weight_decay) : 0.0f;
    // The owned range [a, e) of the parameter, its moments (and master) from their start.
    float* master = masters ? st.masters[i].data<float>() : nullptr;
    if (zero_grads)  // one pass: the update zeroes the gradient it read
      be.run(ops::k::AdamwUpdateZeroGrad(at(w, a), w.dtype(), at(g, a), g.dtype(), master, st.adam_m[i].data<float>(),
                                st.adam_v[i].data<float>(), e - a, args));
    else
      be.run(ops::k::AdamwUpdateTyped(at(w, a), w.dtype(), at(g, a), g.dtype(), master, st.adam_m[i].data<float>(),
                            st.adam_v[i].data<float>(), e - a, args));
  }
}

void zero_grads(ParamSet& ps) {
  for (auto& g : ps.grads) g.zero();
}

void zero_grads_rest(ops::Backend& be, ParamSet& ps) {
  for (size_t i = 0; i < ps.grads.size(); ++i) {
    ops::Tensor& g = ps.grads[i];
    auto [a, e] = ps.owned_range(i);
    if (e <= a) {  // adamw_step skipped this parameter: all of it
      g.zero();
      continue;
    }
    const size_t es = ops::dtype_size(g.dtype());
    if (a > 0) be.mem_zero(at(g, 0), static_cast<size_t>(a) * es);
    if (e < g.numel()) be.mem_zero(at(g, e), static_cast<size_t>(g.numel() - e) * es);
  }
}

}  // namespace runner
