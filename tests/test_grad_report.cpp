// The per-tensor gradient range report and the loss scaler's rules, on one rank with gradients
// set by hand: the numbers each field promises, the scale conflict and the pair it names, and
// the first non-finite tensor in backward order.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "ops/backend.h"
#include "ops/convert.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/train/precision.h"
#include "runner/train/rank_model.h"

using namespace runner;

namespace {

const char* kRecipe = R"(name: g
model:
  vocab_size: 64
  seq_len: 16
  d_model: 32
  n_layers: 2
  n_heads: 2
  tie_embeddings: true
batch:
  micro: 2
  accum: 1
precision:
  compute: fp16
)";

struct Fixture {
  Recipe recipe = load_recipe_text(kRecipe, "g.yaml", {});
  Plan plan = make_plan(recipe, 1);
  parallel::Grid grid{parallel::self_comm(), {1, 1, 1}};
  ParamSet ps = init_params(plan.layout->rank_params(0, 0), recipe.model, 1);
  RankModel model{plan, grid, ops::cpu_backend(), ps};

  // Every element of parameter `name`'s gradient set to `v` (scaled by `scale`, as the
  // backward leaves it).
  void fill(const std::string& name, float v) {
    const int i = ps.index(name);
    REQUIRE(i >= 0);
    float* g = ps.grads[static_cast<size_t>(i)].data<float>();
    for (int64_t k = 0; k < ps.grads[static_cast<size_t>(i)].numel(); ++k) g[k] = v;
  }
  const GradRange& find(const GradReport& r, const std::string& name) {
    for (auto& t : r.tensors)
      if (t.name == name) return t;
    FAIL("no tensor " << name);
    return r.tensors.front();
  }
};

}  // namespace

TEST_CASE("gradient range: max, headroom, underflow and the scale each tensor allows") {
  Fixture f;
  const double scale = 1024;
  for (auto& n : f.ps.names) f.fill(n, static_cast<float>(1e-3 * scale));
  f.fill("h.0.ln1.weight", static_cast<float>(1e-11 * scale));  // 1e-8 once scaled: below 2^-24, flushes
  f.fill("h.1.mlp.fc.weight", 0.0f);
  GradReport r = grad_report(ops::cpu_backend(), f.model, f.ps, *f.plan.layout, f.grid, scale);
  REQUIRE(r.tensors.size() == f.plan.layout->params().size());
  const GradRange& a = f.find(r, "h.0.attn.qkv.weight");
  CHECK(a.max_abs == doctest::Approx(1e-3));
  CHECK(a.headroom_bits == doctest::Approx(std::log2(65504.0 / (1e-3 * scale))));
  CHECK(a.underflow == 0);
  CHECK(a.scale_hi == doctest::Approx(65504.0 / 1e-3));
  // 1e-3's exponent bin starts at 2^-10: the smallest scale that lifts the whole bin above
  // 2^-24 is 2^-14, within a factor 2 above 2^-24 / 1e-3.
  CHECK(a.scale_lo == std::ldexp(1.0, -14));
  CHECK(a.scale_lo >= kF16MinSubnormal / 1e-3);
  const GradRange& tiny = f.find(r, "h.0.ln1.weight");
  CHECK(tiny.underflow == 1.0);
  CHECK(tiny.scale_lo == std::ldexp(1.0, 13));  // 1e-11's bin starts at 2^-37: needs 2^13 > 1024
  const GradRange& zero = f.find(r, "h.1.mlp.fc.weight");
  CHECK(zero.zeros == zero.numel);
  CHECK(std::isinf(zero.headroom_bits));
  CHECK_FALSE(r.conflict());  // 1e-11 and 1e-3 fit one scale (8192 < 65504/1e-3)
  CHECK(r.first_nonfinite == -1);
}

TEST_CASE("gradient range: no single scale suits 1e-13 and 1.0 gradients; the pair is named") {
  Fixture f;
  for (auto& n : f.ps.names) f.fill(n, 1e-4f);
  f.fill("h.1.ln2.weight", 1e-13f);  // needs a scale >= 2^-24 / 1e-13 ~ 6e5
  f.fill("h.0.mlp.proj.weight", 1.0f);  // overflows above 65504
  GradReport r = grad_report(ops::cpu_backend(), f.model, f.ps, *f.plan.layout, f.grid, 1.0);
  REQUIRE(r.conflict());
  CHECK(r.tensors[static_cast<size_t>(r.needs_large)].name == "h.1.ln2.weight");
  CHECK(r.tensors[static_cast<size_t>(r.needs_small)].name == "h.0.mlp.proj.weight");
  CHECK(describe_tensor(r.tensors[static_cast<size_t>(r.needs_large)]) == "h.1.ln2.weight (layer 1)");
}

TEST_CASE("gradient range: the first non-finite gradient in backward order") {
  Fixture f;
  for (auto& n : f.ps.names) f.fill(n, 1e-3f);
  f.fill("h.0.attn.qkv.weight", INFINITY);
  f.fill("h.1.mlp.fc.bias", NAN);
  GradReport r = grad_report(ops::cpu_backend(), f.model, f.ps, *f.plan.layout, f.grid, 1.0);
  REQUIRE(r.first_nonfinite >= 0);
  CHECK(r.tensors[static_cast<size_t>(r.first_nonfinite)].name == "h.1.mlp.fc.bias");  // layer 1's backward runs first
  CHECK(f.find(r, "h.0.attn.qkv.weight").nonfinite == f.find(r, "h.0.attn.qkv.weight").numel);
  // The tied embedding's gradient is first in backward order (the head uses it last).
  f.fill("wte", INFINITY);
  r = grad_report(ops::cpu_backend(), f.model, f.ps, *f.plan.layout, f.grid, 1.0);
  CHECK(describe_tensor(r.tensors[static_cast<size_t>(r.first_nonfinite)]) == "wte (embedding)");
}

TEST_CASE("loss scaler: backoff, min_scale, growth after the interval, the consecutive limit; inactive for bf16") {
  PrecisionConfig p;
  p.compute = FloatFormat::fp16;
  p.loss_scale.init = 8;
  p.loss_scale.backoff_factor = 0.5;
  p.loss_scale.growth_factor = 2;
  p.loss_scale.growth_interval = 2;
  p.loss_scale.min_scale = 2;
  p.loss_scale.max_consecutive_skips = 2;
  LossScaler s(p);
  REQUIRE(s.active());
  LossScalerState st;
  st.scale = s.initial();
  CHECK(st.scale == 8);
  CHECK_FALSE(s.update(st, false));
  CHECK(st.scale == 4);
  CHECK_FALSE(s.update(st, false));
  CHECK(st.scale == 2);
  CHECK_FALSE(s.exhausted(st));
  CHECK_FALSE(s.update(st, false));
  CHECK(st.scale == 2);  // min_scale
  CHECK(s.exhausted(st));  // 3 in a row > 2
  CHECK(st.skipped_steps == 3);
  CHECK(s.update(st, true));
  CHECK(st.consecutive_skips == 0);
  CHECK(st.scale == 2);
  CHECK(s.update(st, true));
  CHECK(st.scale == 4);  // grew after 2 clean steps
  CHECK(st.good_steps == 0);

  p.loss_scale.mode = LossScaleMode::fixed;
  LossScaler fixed(p);
  LossScalerState fs;
  fs.scale = fixed.initial();
  CHECK_FALSE(fixed.update(fs, false));
  CHECK(fs.scale == 8);  // static: skipped, never backed off
  for (int k = 0; k < 5; ++k) fixed.update(fs, true);
  CHECK(fs.scale == 8);

  p.compute = FloatFormat::bf16;
  p.loss_scale.mode = LossScaleMode::dynamic;
  CHECK_FALSE(LossScaler(p).active());
  CHECK(LossScaler(p).initial() == 1);
  p.compute = FloatFormat::fp16;
  p.loss_scale.mode = LossScaleMode::none;
  CHECK_FALSE(LossScaler(p).active());
}
