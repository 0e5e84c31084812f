// make_plan: resolution, the model's layout, the ledger, inference sizing and, for a recipe
// that does not fit, suggestions (see plan.h; the parts live in resolve.cpp, ledger.cpp,
// suggest.cpp and report.cpp).
#include "runner/plan/plan.h"

#include <algorithm>
#include <optional>

#include "ops/gemm_path.h"
#include "runner/device/devices.h"
#include "runner/plan/plan_internal.h"

namespace runner {

namespace {

// The whole model's graph spec on tensor-parallel rank 0, for the plan's micro-batch.
GptSpec whole_model_spec(const Recipe& r, const Plan& p) {
  GptSpec s;
  s.model = r.model;
  s.B = p.micro;
  s.T = r.model.seq_len;
  s.tp = p.tp;
  s.sequence_parallel = r.parallel.sequence_parallel;
  s.vocab_padded = p.vocab_padded;
  s.act_dtype = plan_detail::dtype_of(to_string(r.precision.compute));
  s.grad_dtype = r.precision.compute == FloatFormat::fp32 ? ops::DType::F32
                                                          : plan_detail::dtype_of(to_string(r.precision.grad_accum));
  s.logits_grad16 = r.precision.compute != FloatFormat::fp32 && r.precision.logits_grad == LogitsGrad::compute;
  s.recompute = recompute_sets(r.recompute, r.model.n_layers);
  return s;
}

}  // namespace

const StageLedger& Plan::worst_stage() const {
  return *std::max_element(stages.begin(), stages.end(),
                           [](const StageLedger& a, const StageLedger& b) { return a.total() < b.total(); });
}

std::vector<parallel::PipeAction> Plan::schedule(int stage) const {
  // Without pipelining, 1F1B on one stage: each micro-batch's forward, then its backward.
  if (pp <= 1) return parallel::schedule_1f1b(0, 1, static_cast<int>(accum));
  return parallel::pipeline_schedule(to_string(recipe.parallel.schedule), stage, static_cast<int>(pp), static_cast<int>(accum),
                                     static_cast<int>(chunks));
}

Plan make_plan(const Recipe& r, int64_t world_size) { return plan_detail::make_plan(r, world_size, true); }

Plan plan_detail::make_plan(const Recipe& r, int64_t world_size, bool with_suggestions) {
  // A GPU device's dry runs take cuBLASLt's GEMM paths (16-bit operands read as stored), as
  // its executor does, whatever this machine's CPU would choose: the ledger prices the GPU.
  std::optional<ops::ScopedGemmPaths> gpu_paths;
  if (device_kind(r.hardware).gpu) gpu_paths.emplace(ops::device_gemm_paths());
  Plan p;
  p.recipe = r;
  resolve_grid(r, world_size, p);
  resolve_and_check(r, p);
  p.tokens_per_step = p.global * r.model.seq_len;
  p.device_memory = device_memory_bytes(r.hardware);
  p.peak_flops = device_peak_flops(r.hardware, r.precision.compute);
  GptSpec whole = whole_model_spec(r, p);
  if (r.recompute.mode == RecomputeMode::automatic) choose_recompute(r, p, whole);
  p.layout = std::make_shared<const ModelLayout>(whole, p.stage_layers, p.chunks);
  compute_ledger(r, p);
  p.param_count = p.layout->param_count();
  // 6N per token for the matrices plus attention's 12 * L * T * C (Kaplan et al. 2020; PaLM's MFU).
  p.flops_per_token = 6.0 * static_cast<double>(p.param_count) +
                      12.0 * r.model.n_layers * r.model.seq_len * r.model.d_model;
  p.fits = p.worst_stage().total() <= p.device_memory;
  plan_inference(r, p);
  if (!p.fits && with_suggestions) suggest(r, p);
  return p;
}

}  // namespace runner
