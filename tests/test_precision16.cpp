// 16-bit storage: the conversions round as the formats do, and the executor runs a model whose
// activations are stored in bf16 / fp16 (fp32 compute inside each operator) with a dry run that
// still predicts every account's measured peak byte for byte.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/convert.h"
#include "ops/executor.h"
#include "ops/rng.h"
#include "runner/model/gpt.h"
#include "tests/support/device.h"
#include "tests/support/models.h"

using namespace runner;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

TEST_CASE("bf16 and fp16: every 16-bit pattern survives widening and rounding back") {
  for (ops::DType t : {ops::DType::BF16, ops::DType::F16}) {
    CAPTURE(ops::dtype_name(t));
    std::vector<uint16_t> all(65536), back(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> wide(65536);
    ops::to_f32(wide.data(), all.data(), t, 65536);
    ops::from_f32(back.data(), t, wide.data(), 65536);
    int mismatches = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      if (std::isnan(wide[i])) {
        mismatches += !std::isnan(t == ops::DType::BF16 ? ops::bf16_to_f32(back[i]) : ops::f16_to_f32(back[i]));
      } else {
        mismatches += back[i] != all[i];
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("fp16 rounding: nearest even, overflow to inf, subnormals, underflow to zero") {
  CHECK(ops::f32_to_f16(65504.0f) == 0x7bff);
  CHECK(ops::f32_to_f16(65519.0f) == 0x7bff);            // below the midpoint 65520
  CHECK(ops::f32_to_f16(65520.0f) == 0x7c00);            // the midpoint ties to even: inf
  CHECK(ops::f32_to_f16(-1e6f) == 0xfc00);
  CHECK(ops::f32_to_f16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(ops::f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // half of it ties to even (zero)
  CHECK(ops::f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(ops::f32_to_f16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units ties to even: 2
  CHECK(ops::f32_to_f16(std::ldexp(1.0f, -26)) == 0x0000);
  CHECK(ops::f32_to_f16(-std::ldexp(1.0f, -30)) == 0x8000);  // signed zero
  CHECK(ops::f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie: even mantissa stays
  CHECK(ops::f32_to_f16(1.0f + std::ldexp(3.0f, -11)) == 0x3c02);  // tie: odd mantissa rounds up
  CHECK(std::isnan(ops::f16_to_f32(ops::f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(ops::f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(ops::f16_to_f32(0x03ff) == std::ldexp(1023.0f, -24));
}

TEST_CASE("bf16 rounding: nearest even, NaN stays NaN, the fp32 range is kept") {
  CHECK(ops::f32_to_bf16(1.0f) == 0x3f80);
  CHECK(ops::f32_to_bf16(from_bits(0x3f808000)) == 0x3f80);  // tie, even stays
  CHECK(ops::f32_to_bf16(from_bits(0x3f818000)) == 0x3f82);  // tie, odd rounds up
  CHECK(ops::f32_to_bf16(from_bits(0x3f808001)) == 0x3f81);  // above the tie
  CHECK(ops::f32_to_bf16(3e38f) == (bits(3e38f) + 0x7fff + ((bits(3e38f) >> 16) & 1)) >> 16);
  CHECK(std::isinf(ops::bf16_to_f32(ops::f32_to_bf16(std::numeric_limits<float>::max()))));  // rounds up past max
  CHECK(std::isnan(ops::bf16_to_f32(ops::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(ops::bf16_to_f32(ops::f32_to_bf16(1e-40f)) != 0.0f);  // subnormals are kept
}

namespace {

ModelConfig tiny(bool llama) {
  ModelConfig m = test_support::small_model(61, 16, 32, 4, 2);
  if (llama) test_support::make_llama(m);
  return m;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  size_t act_after_forward = 0;
};

Result run(const ModelConfig& m, ops::DType act, const std::string& recompute) {
  ops::Backend& be = test_support::test_device();  // before any tensor (strict: device memory)
  GptSpec spec;
  spec.model = m;
  spec.B = 2;
  spec.act_dtype = act;
  RecomputeConfig rc;
  if (recompute == "full") rc.mode = RecomputeMode::full;
  else if (!recompute.empty()) { rc.mode = RecomputeMode::selective; rc.modules = {parse_enum<RecomputeModule>(recompute).value()}; }
  spec.recompute = recompute_sets(rc, m.n_layers);
  ops::Graph g = build_gpt_graph(spec);
  ParamSet ps = init_params(g, m, 11);
  ops::Executor ex(g, be);
  bind_params(ex, g, ps);
  auto [tok, tgt] = test_support::random_tokens(spec.B * m.seq_len, m.vocab_size);
  ops::MemoryEstimate est = ops::Executor::simulate(g);
  auto& mt = ops::MemoryTracker::instance();
  const size_t act0 = mt.current(ops::Account::Activations), ws0 = mt.current(ops::Account::Workspace);
  mt.reset_peaks();
  auto l = ex.forward(tok.data(), tgt.data(), true, 1, 0);
  Result r;
  r.act_after_forward = mt.current(ops::Account::Activations) - act0;
  ex.backward(1.0f / static_cast<float>(l.count));
  // The dry run (the ledger) predicts the 16-bit storage and the fp32 copies byte for byte.
  CHECK(r.act_after_forward == est.activations_after_forward);
  CHECK(mt.peak(ops::Account::Activations) - act0 == est.peak[static_cast<int>(ops::Account::Activations)]);
  CHECK(mt.peak(ops::Account::Workspace) - ws0 == est.peak[static_cast<int>(ops::Account::Workspace)]);
  CHECK(mt.current(ops::Account::Workspace) == ws0);
  r.loss = l.sum / static_cast<double>(l.count);
  for (auto& t : ps.grads) r.grads.push_back(test_support::host_values(t));
  return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

TEST_CASE("16-bit activations: numbers track fp32, memory is halved, the dry run stays exact") {
  for (bool llama : {false, true}) {
    for (const char* rc : {"", "attention_core", "full"}) {
      CAPTURE(llama);
      CAPTURE(rc);
      const ModelConfig m = tiny(llama);
      Result ref = run(m, ops::DType::F32, rc);
      // Each stored activation carries one rounding of 2^-9 (bf16) or 2^-12 (fp16) relative; a
      // gradient passes through about a dozen of them (2 layers x norm, attention, MLP, residual
      // and their backward), which the bounds allow with a margin of ~4x (the errors are not
      // all aligned, so they grow more like sqrt(count) than count).
      for (auto [t, loss_tol, grad_tol] : {std::tuple{ops::DType::BF16, 2e-2, 8e-2}, std::tuple{ops::DType::F16, 3e-3, 1e-2}}) {
        CAPTURE(ops::dtype_name(t));
        Result r16 = run(m, t, rc);
        CHECK(std::fabs(r16.loss - ref.loss) < loss_tol * ref.loss);
        for (size_t i = 0; i < ref.grads.size(); ++i) {
          CAPTURE(i);
          CHECK(rel_l2(r16.grads[i], ref.grads[i]) < grad_tol);
        }
        // The logits, the loss and the norm statistics stay fp32; every other activation halves.
        if (std::string(rc) != "full") CHECK(r16.act_after_forward < 0.75 * static_cast<double>(ref.act_after_forward));
      }
    }
  }
}

namespace {
// The parameter gradients of `ps` (any dtype) as doubles, tensor by tensor.
std::vector<std::vector<double>> grads_f64(const ParamSet& ps) {
  std::vector<std::vector<double>> out;
  for (auto& t : ps.grads) {
    const std::vector<float> f = test_support::host_values(t);  // widened from 16 bits
    out.emplace_back(f.begin(), f.end());
  }
  return out;
}

double rel_l2_f64(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    for (size_t j = 0; j < ref[i].size(); ++j) {
      num += (a[i][j] - ref[i][j]) * (a[i][j] - ref[i][j]);
      den += ref[i][j] * ref[i][j];
    }
  return std::sqrt(num / den);
}
}  // namespace

TEST_CASE("accumulating 16 micro-batches in bf16 drifts further from a float64 sum than accumulating in fp32") {
  // The same bf16 model and the same 16 micro-batches; each micro-batch's per-node gradients
  // are rounded to bf16 alike in every variant. Only the buffer they are summed into differs:
  // fp32 (precision.grad_accum: fp32, the default) adds ~2^-24 relative per addition, bf16 adds
  // ~2^-9 per addition, so after 16 additions bf16 should be off by roughly 2^-9 * sqrt(16)
  // relative, three orders of magnitude more than fp32.
  ops::Backend& be = test_support::test_device();
  const ModelConfig m = tiny(false);
  GptSpec spec;
  spec.model = m;
  spec.B = 2;
  spec.act_dtype = ops::DType::BF16;
  spec.recompute = recompute_sets(RecomputeConfig{}, m.n_layers);
  ops::Graph g = build_gpt_graph(spec);
  spec.grad_dtype = ops::DType::BF16;  // precision.grad_accum: bf16
  ops::Graph g16 = build_gpt_graph(spec);
  const int K = 16;
  const int64_t n = spec.B * m.seq_len;
  auto batch = [&](int k, std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
    tok.resize(static_cast<size_t>(n));
    tgt.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      tok[static_cast<size_t>(i)] = static_cast<int32_t>(ops::rng_u32(30 + k, static_cast<uint64_t>(i)) % m.vocab_size);
      tgt[static_cast<size_t>(i)] = static_cast<int32_t>(ops::rng_u32(60 + k, static_cast<uint64_t>(i)) % m.vocab_size);
    }
  };
  // Runs the K micro-batches into `ps` (gradients summed by the executor); with `ref`, zeroes
  // the buffer after each and sums in double instead.
  auto accumulate = [&](const ops::Graph& gr, ParamSet& ps, std::vector<std::vector<double>>* ref) {
    ops::Executor ex(gr, be);
    bind_params(ex, gr, ps);
    std::vector<int32_t> tok, tgt;
    for (int k = 0; k < K; ++k) {
      batch(k, tok, tgt);
      auto l = ex.forward(tok.data(), tgt.data(), true, 1, 0);
      ex.backward(1.0f / static_cast<float>(l.count * K));
      if (!ref) continue;
      auto gk = grads_f64(ps);
      if (ref->empty()) *ref = gk;
      else
        for (size_t i = 0; i < gk.size(); ++i)
          for (size_t j = 0; j < gk[i].size(); ++j) (*ref)[i][j] += gk[i][j];
      for (auto& t : ps.grads) t.zero();
    }
  };
  std::vector<std::vector<double>> ref;
  ParamSet p_ref = init_params(g, m, 11);
  accumulate(g, p_ref, &ref);
  ParamSet p32 = init_params(g, m, 11);
  accumulate(g, p32, nullptr);
  ParamSet p16 = init_params(g16, m, 11);
  REQUIRE(p16.grads[0].dtype() == ops::DType::BF16);
  accumulate(g16, p16, nullptr);
  const double e32 = rel_l2_f64(grads_f64(p32), ref), e16 = rel_l2_f64(grads_f64(p16), ref);
  MESSAGE("relative L2 error of the accumulated gradient after " << K << " micro-batches: fp32 " << e32 << ", bf16 " << e16);
  CHECK(e32 < 1e-5);
  CHECK(e16 > 1e-3);
  CHECK(e16 > 100 * e32);
}
