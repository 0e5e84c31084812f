// The fused optimizer phase (ops/cpu/adamw.h): the CPU's
// adamw_update_zero_grad must give the bytes of the path it replaced (the host default
// Backend::adamw_update_typed, then a zeroing of the gradient) for fp32 parameters and for
// bf16 / fp16 ones with and without fp32 masters, at sizes that are not multiples of the
// block (2^14) or the vector width (16), with and without weight decay, at 1, 2 and 3
// threads; and the gradient must be zero after it. The threaded 16-bit sum of squares (the
// gradient norm) must equal the host default's, and adamw_step's fused zeroing plus
// zero_grads_rest must leave the state of adamw_step + zero_grads under a ZeRO-1 piece.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"
#include "runner/train/optimizer.h"

namespace {

using ops::DType;

// Sizes around the block (2^14) and the vector width (16): inline, one block, several blocks
// with a ragged tail.
const std::vector<int64_t> kSizes = {1, 15, 17, 2049, (1 << 14) + 37, 3 * (1 << 14) + 5, 100003};

std::vector<uint16_t> round_all(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> r(x.size());
  ops::from_f32(r.data(), t, x.data(), static_cast<int64_t>(x.size()));
  return r;
}

// One AdamW call's operands as raw bytes of their storage dtypes, so two copies can be run
// through two paths and compared byte for byte.
struct Operands {
  DType pt, gt;
  bool has_master;
  int64_t n;
  std::vector<char> param, grad;
  std::vector<float> master, m, v;

  Operands(DType pt_, DType gt_, bool has_master_, int64_t n_, uint32_t seed)
      : pt(pt_), gt(gt_), has_master(has_master_), n(n_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> w(0.0f, 0.05f), g(0.0f, 0.3f);
    std::uniform_real_distribution<float> u(0.0f, 0.01f);
    std::vector<float> wf(n), gf(n);
    m.resize(n);
    v.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      wf[i] = w(rng);
      gf[i] = g(rng);
      m[i] = 0.1f * g(rng);
      v[i] = u(rng);  // a second moment is >= 0
    }
    if (has_master) master = wf;
    param = bytes_of(wf, pt);
    grad = bytes_of(gf, gt);
  }
  static std::vector<char> bytes_of(const std::vector<float>& x, DType t) {
    std::vector<char> b(x.size() * ops::dtype_size(t));
    if (t == DType::F32) std::memcpy(b.data(), x.data(), b.size());
    else std::memcpy(b.data(), round_all(x, t).data(), b.size());
    return b;
  }
  float* master_ptr() { return has_master ? master.data() : nullptr; }
  bool grad_is_zero() const {
    for (char c : grad)
      if (c != 0) return false;
    return true;
  }
};

void check_same(const Operands& a, const Operands& b) {
  CHECK(a.param == b.param);
  CHECK(a.master == b.master);  // bytes: the vectors hold no NaN here
  CHECK(std::memcmp(a.m.data(), b.m.data(), a.m.size() * 4) == 0);
  CHECK(std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4) == 0);
}

ops::Backend::AdamwArgs args(float wd) {
  ops::Backend::AdamwArgs a;
  a.lr = 3e-4f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = wd;
  a.t = 7;
  a.grad_scale = 0.37f;  // clipping and 1/loss scale, as the trainer passes it
  return a;
}

struct Kind {
  const char* what;
  DType pt, gt;
  bool master;
};
const Kind kKinds[] = {
    {"fp32", DType::F32, DType::F32, false},
    {"bf16 + fp32 masters, fp32 grads", DType::BF16, DType::F32, true},
    {"bf16 + fp32 masters, bf16 grads", DType::BF16, DType::BF16, true},
    {"fp16 + fp32 masters, fp32 grads", DType::F16, DType::F32, true},
    {"fp16 + fp32 masters, fp16 grads", DType::F16, DType::F16, true},
    {"bf16 without masters", DType::BF16, DType::BF16, false},
    {"fp16 without masters, fp32 grads", DType::F16, DType::F32, false},
};

}  // namespace

TEST_CASE("adamw_update_zero_grad: the old path's bytes, gradient zeroed, at 1, 2 and 3 threads") {
  ops::Backend& be = ops::cpu_backend();
  const int before = ops::num_threads();
  for (const Kind& k : kKinds) {
    for (int64_t n : kSizes) {
      for (float wd : {0.0f, 0.1f}) {
        CAPTURE(k.what);
        CAPTURE(n);
        CAPTURE(wd);
        const auto a = args(wd);
        // The old path: the host default (pieces of 2^14 through fp32 buffers, on one thread
        // apart from adamw_update's own split), then the separate zeroing pass.
        ops::set_num_threads(2);
        Operands ref(k.pt, k.gt, k.master, n, 1234u + static_cast<uint32_t>(n));
        ops::adamw_update_typed_composed(be, ops::k::AdamwUpdateTyped(ref.param.data(), k.pt, ref.grad.data(), k.gt, ref.master_ptr(), ref.m.data(),
                                       ref.v.data(), n, a));
        const std::vector<char> grad_before = Operands(k.pt, k.gt, k.master, n, 1234u + static_cast<uint32_t>(n)).grad;
        CHECK(ref.grad == grad_before);  // the old update only reads the gradient
        for (int t : {1, 2, 3}) {
          CAPTURE(t);
          ops::set_num_threads(t);
          Operands got(k.pt, k.gt, k.master, n, 1234u + static_cast<uint32_t>(n));
          be.run(ops::k::AdamwUpdateZeroGrad(got.param.data(), k.pt, got.grad.data(), k.gt, got.master_ptr(), got.m.data(),
                                    got.v.data(), n, a));
          check_same(ref, got);
          CHECK(got.grad_is_zero());
          // The CPU's adamw_update_typed is the same pass without the zeroing.
          Operands typed(k.pt, k.gt, k.master, n, 1234u + static_cast<uint32_t>(n));
          be.run(ops::k::AdamwUpdateTyped(typed.param.data(), k.pt, typed.grad.data(), k.gt, typed.master_ptr(), typed.m.data(),
                                typed.v.data(), n, a));
          check_same(ref, typed);
          CHECK(typed.grad == grad_before);
        }
      }
    }
  }
  ops::set_num_threads(before);
}

TEST_CASE("adamw_update_zero_grad: a 16-bit copy is the rounding of the updated master") {
  // Guards the fused rounding itself (not only its agreement with the old path).
  ops::Backend& be = ops::cpu_backend();
  const int64_t n = (1 << 14) + 21;
  for (DType t : {DType::BF16, DType::F16}) {
    Operands o(t, DType::F32, true, n, 99u);
    be.run(ops::k::AdamwUpdateZeroGrad(o.param.data(), t, o.grad.data(), DType::F32, o.master.data(), o.m.data(), o.v.data(), n,
                              args(0.1f)));
    const std::vector<uint16_t> want = round_all(o.master, t);
    CHECK(std::memcmp(o.param.data(), want.data(), want.size() * 2) == 0);
  }
}

TEST_CASE("sum_squares_typed of 16-bit tensors: threaded, the host default's bits at 1, 2 and 3 threads") {
  ops::Backend& be = ops::cpu_backend();
  const int before = ops::num_threads();
  for (DType t : {DType::BF16, DType::F16}) {
    for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{3 * (1 << 14) + 7}, int64_t{200001}}) {
      CAPTURE(n);
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::normal_distribution<float> d(0.0f, 2.0f);
      std::vector<float> x(static_cast<size_t>(n));
      for (float& f : x) f = d(rng);
      const std::vector<uint16_t> h = round_all(x, t);
      ops::set_num_threads(1);
      const double want = [&] {
        double r = 0;
        ops::sum_squares_typed_composed(be, ops::k::SumSquaresTyped(h.data(), t, n, &r));
        return r;
      }();
      for (int th : {1, 2, 3}) {
        CAPTURE(th);
        ops::set_num_threads(th);
        const double got = ops::sum_squares_typed(be, h.data(), t, n);
        CHECK(std::memcmp(&got, &want, sizeof got) == 0);
      }
    }
  }
  ops::set_num_threads(before);
}

TEST_CASE("mem_zero: a large buffer zeroed over the team, exactly its bytes") {
  ops::Backend& be = ops::cpu_backend();
  const int before = ops::num_threads();
  ops::set_num_threads(3);
  const size_t bytes = (size_t{5} << 20) + 3;  // past the threaded threshold, ragged
  std::vector<unsigned char> buf(bytes + 128, 0xAB);
  be.mem_zero(buf.data() + 64, bytes);
  size_t zeros = 0, guards = 0;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (i >= 64 && i < 64 + bytes) zeros += buf[i] == 0;
    else guards += buf[i] == 0xAB;
  }
  CHECK(zeros == bytes);
  CHECK(guards == 128);
  ops::set_num_threads(before);
}

namespace {

// Two parameters, one bf16 with fp32 masters and a ZeRO-1-like piece [a, e), one whole.
runner::TrainState zero1_state(bool masters) {
  runner::TrainState st;
  runner::ParamSet& ps = st.params;
  const int64_t n0 = 3 * (1 << 14) + 9, n1 = 777;
  const DType t = masters ? DType::BF16 : DType::F32;
  ps.names = {"w", "b"};
  ps.decay = {true, false};
  ps.owned = {{1000, 1000 + (1 << 14) + 3}, {0, n1}};
  ps.sharded = {true, false};
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (int64_t n : {n0, n1}) {
    std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[i] = d(rng), g[i] = d(rng);
    ps.values.emplace_back(std::vector<int64_t>{n}, t, ops::Account::Parameters);
    ps.grads.emplace_back(std::vector<int64_t>{n}, DType::F32, ops::Account::Gradients);
    ps.values.back().write_from_host(Operands::bytes_of(w, t).data());
    ps.grads.back().write_from_host(g.data());
  }
  if (masters) {
    for (size_t i = 0; i < 2; ++i) {
      auto [a, e] = ps.owned_range(i);
      st.masters.emplace_back(runner::moment_shape(ps, i), DType::F32, ops::Account::Optimizer);
      std::vector<float> w(static_cast<size_t>(e - a));
      std::vector<uint16_t> h(static_cast<size_t>(e - a));
      std::memcpy(h.data(), static_cast<const uint16_t*>(ps.values[i].raw()) + a, h.size() * 2);
      ops::to_f32(w.data(), h.data(), DType::BF16, e - a);
      st.masters.back().write_from_host(w.data());
    }
  }
  st.step = 4;
  return st;
}

std::vector<char> bytes(const ops::Tensor& t) {
  std::vector<char> b(t.nbytes());
  t.read_to_host(b.data());
  return b;
}

}  // namespace

TEST_CASE("adamw_step(zero_grads) + zero_grads_rest == adamw_step + zero_grads, under a ZeRO-1 piece") {
  ops::Backend& be = ops::cpu_backend();
  runner::OptimizerConfig o;
  for (bool masters : {false, true}) {
    CAPTURE(masters);
    runner::TrainState old = zero1_state(masters), fused = zero1_state(masters);
    runner::adamw_step(be, o, old, 1e-3, 0.5);
    runner::zero_grads(old.params);
    runner::adamw_step(be, o, fused, 1e-3, 0.5, /*zero_grads=*/true);
    // Inside the owned ranges the gradients are zero already; outside they are not yet.
    CHECK(bytes(fused.params.grads[0]) != bytes(old.params.grads[0]));
    runner::zero_grads_rest(be, fused.params);
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      CHECK(bytes(fused.params.values[i]) == bytes(old.params.values[i]));
      CHECK(bytes(fused.params.grads[i]) == bytes(old.params.grads[i]));
      CHECK(bytes(fused.adam_m[i]) == bytes(old.adam_m[i]));
      CHECK(bytes(fused.adam_v[i]) == bytes(old.adam_v[i]));
      if (masters) CHECK(bytes(fused.masters[i]) == bytes(old.masters[i]));
    }
  }
}
