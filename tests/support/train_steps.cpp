// A few training steps of a small GPT graph, the dry run checked at each (train_steps.h).
#include "tests/support/train_steps.h"

#include <algorithm>

#include <doctest/doctest.h>

#include "ops/executor.h"
#include "ops/ops.h"
#include "tests/support/device.h"
#include "tests/support/models.h"

namespace test_support {

TrainSteps train_steps(const runner::GptSpec& spec, int steps) {
  ops::Backend& be = test_device();
  const runner::ModelConfig& m = spec.model;
  ops::Graph g = runner::build_gpt_graph(spec);
  runner::ParamSet ps = runner::init_params(g, m, 11);
  ops::Executor ex(g, be);
  runner::bind_params(ex, g, ps);
  const ops::MemoryEstimate est = ops::Executor::simulate(g);
  std::vector<ops::Tensor> mom, vel;
  for (auto& p : ps.values) {
    mom.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
    vel.push_back(ops::Tensor::zeros(p.shape(), ops::DType::F32, ops::Account::Optimizer));
  }
  auto& mt = ops::MemoryTracker::instance();
  TrainSteps r;
  const int ws = static_cast<int>(ops::Account::Workspace), act = static_cast<int>(ops::Account::Activations);
  for (int s = 0; s < steps; ++s) {
    auto [tok, tgt] = random_tokens(spec.B * m.seq_len + s, m.vocab_size);
    const size_t ws0 = mt.current(ops::Account::Workspace), act0 = mt.current(ops::Account::Activations);
    mt.reset_peaks();
    for (auto& gr : ps.grads) be.mem_zero(gr.raw(), gr.nbytes());
    auto l = ex.forward(tok.data() + s, tgt.data() + s, true, 100 + s, 0);
    ex.backward(1.0f / static_cast<float>(l.count));
    const size_t wpeak = mt.peak(ops::Account::Workspace) - ws0;
    r.dry_run_exact = r.dry_run_exact && wpeak == est.peak[ws] &&
                      mt.peak(ops::Account::Activations) - act0 == est.peak[act];
    r.workspace_peak = std::max(r.workspace_peak, wpeak);
    r.losses.push_back(l.sum / static_cast<double>(l.count));
    ops::Backend::AdamwArgs args;
    args.lr = 1e-2f, args.beta1 = 0.9f, args.beta2 = 0.95f, args.eps = 1e-8f, args.t = s + 1;
    for (size_t i = 0; i < ps.values.size(); ++i)  // the parameters in their compute dtype
      be.run(ops::k::AdamwUpdateTyped(ps.values[i].raw(), ps.values[i].dtype(), ps.grads[i].raw(), ps.grads[i].dtype(),
                            nullptr, mom[i].data<float>(), vel[i].data<float>(), ps.values[i].numel(), args));
  }
  for (auto& t : ps.grads) r.grads.push_back(host_values(t));
  for (auto& t : ps.values) r.weights.push_back(host_values(t));
  return r;
}

TrainSteps train_steps_native16(const runner::GptSpec& spec, bool native, int steps) {
  ops::set_native16(native);
  TrainSteps r = train_steps(spec, steps);
  ops::set_native16(true);
  CHECK(r.dry_run_exact);
  return r;
}

TrainSteps train_steps_native16(const runner::ModelConfig& m, ops::DType act, bool native, int steps, int64_t B,
                                ops::DType grad) {
  runner::GptSpec spec;
  spec.model = m;
  spec.B = B;
  spec.act_dtype = act;
  spec.grad_dtype = grad;
  return train_steps_native16(spec, native, steps);
}

void check_same_bits(const TrainSteps& a, const TrainSteps& b, bool weights) {
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t s = 0; s < a.losses.size(); ++s) {
    CAPTURE(s);
    CHECK(std::memcmp(&a.losses[s], &b.losses[s], sizeof(double)) == 0);
  }
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(a.grads[i], b.grads[i]));
    if (weights) CHECK(same_bits(a.weights[i], b.weights[i]));
  }
}

}  // namespace test_support
