// The 16-bit-native causal self-attention (Backend::attention_forward16 /
// attention_backward16, ops/cpu/attention.cpp) against the widened path it replaces, bit for bit.
//
// 1. The kernels against what the executor's widened path computes from the same 16-bit
//    tensors: widen qkv (and dout), the fp32 kernel, round out; dqkv (prefilled with random
//    values, so the fold is exercised) := RNE(dqkv + g), g the fp32 kernel's gradient
//    accumulated into zeros. lse compared as it is. Sequence lengths that are not multiples of
//    16 nor of the 64-row block (1, 17, 70, 130), head sizes 24 and 64, multi-head and grouped
//    query attention (groups 2 and 3), dropout 0 and 0.1, bf16 and fp16, on 1, 2 and 3 threads.
// 2. A GPT-style and a Llama-style (RoPE, grouped-query) model trained 3 steps with the native
//    kernels on and off: identical losses and gradients, the dry run exact in both modes, and
//    (with the Linears on oneDNN's 16-bit path, where this machine has it) less workspace with
//    native kernels, the native peak below what the widened attention's backward alone holds
//    (its fp32 qkv, dout and dqkv), so that an attention that silently went back to the widened
//    path fails here.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/executor.h"
#include "ops/gemm_path.h"
#include "ops/kernel_check.h"
#include "ops/ops.h"
#include "ops/rng.h"
#include "runner/model/gpt.h"
#include "tests/support/device.h"
#include "tests/support/models.h"
#include "tests/support/train_steps.h"

using ops::DType;
using V16 = std::vector<uint16_t>;
using VF = std::vector<float>;

namespace {

ops::Backend& cpu() { return ops::cpu_backend(); }

VF rand_f(int64_t n, uint64_t seed, float scale) {
  VF f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[static_cast<size_t>(i)] = scale * (2.0f * ops::rng_uniform(seed, i) - 1.0f);
  return f;
}
V16 rand16(int64_t n, DType t, uint64_t seed, float scale) {
  const VF f = rand_f(n, seed, scale);
  V16 h(f.size());
  ops::from_f32(h.data(), t, f.data(), n);
  return h;
}
VF widen(const V16& h, DType t) {
  VF f(h.size());
  ops::to_f32(f.data(), h.data(), t, static_cast<int64_t>(h.size()));
  return f;
}
using test_support::same_bits;

const DType kTypes[] = {DType::BF16, DType::F16};

// Restores the OpenMP team size a case changed.
struct Threads {
  int saved = ops::num_threads();
  explicit Threads(int n) { ops::set_num_threads(n); }
  ~Threads() { ops::set_num_threads(saved); }
};

struct AttnCase {
  int B, T, HS, NH, NKV;
  float p;
};

// One case in format t: the native kernels and the widened path from the same tensors.
void check_case(const AttnCase& k, DType t, uint64_t seed) {
  const int C = k.NH * k.HS, W = C + 2 * k.NKV * k.HS;
  const ops::Heads hd = ops::Heads::grouped(k.NH, k.NKV);
  const int64_t N = static_cast<int64_t>(k.B) * k.T, nlse = static_cast<int64_t>(k.B) * k.NH * k.T;
  ops::DropoutSpec drop;
  drop.p = k.p;
  drop.key = 77 + seed;
  drop.offset = 1000;
  const V16 qkv = rand16(N * W, t, seed, 2.0f), dout = rand16(N * C, t, seed + 1, 1.0f);
  const V16 d0 = rand16(N * W, t, seed + 2, 0.5f);  // dqkv before the call (the fold adds to it)
  const int64_t nwork = ops::k::AttentionBackward::work_floats(k.B, k.T, C, hd);

  // The widened path.
  const VF qkvw = widen(qkv, t);
  VF outw(static_cast<size_t>(N * C)), lsew(static_cast<size_t>(nlse));
  cpu().run(ops::k::AttentionForward(outw.data(), lsew.data(), qkvw.data(), k.B, k.T, C, hd, drop));
  V16 out_ref(outw.size());
  ops::from_f32(out_ref.data(), t, outw.data(), N * C);
  VF g(static_cast<size_t>(N * W), 0.0f), work_ref(static_cast<size_t>(nwork));
  const VF doutw = widen(dout, t);
  cpu().run(ops::k::AttentionBackward(g.data(), doutw.data(), qkvw.data(), lsew.data(), k.B, k.T, C, hd, drop,
                           nwork ? work_ref.data() : nullptr));
  V16 d_ref = d0;
  cpu().run(ops::k::Accumulate(d_ref.data(), t, g.data(), N * W));

  // The native kernels.
  V16 out(static_cast<size_t>(N * C));
  VF lse(static_cast<size_t>(nlse)), work(static_cast<size_t>(nwork));
  cpu().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), k.B, k.T, C, hd, drop), t);
  V16 d = d0;
  cpu().run(ops::k::AttentionBackward(d.data(), dout.data(), qkv.data(), lse.data(), k.B, k.T, C, hd, drop,
                             nwork ? work.data() : nullptr), t);
  CHECK(same_bits(out, out_ref));
  CHECK(same_bits(lse, lsew));
  CHECK(same_bits(d, d_ref));
  CHECK(!same_bits(d, d0));  // the gradient did arrive
}

}  // namespace

TEST_CASE("native16 attention kernels are bit-identical to the widened path (odd T, GQA, dropout, threads)") {
  uint64_t seed = 1;
  for (int threads : {1, 2, 3}) {
    Threads th(threads);
    for (int T : {1, 17, 70, 130})
      for (int HS : {24, 64})
        for (const auto& [NH, NKV] : {std::pair{3, 3}, std::pair{4, 2}, std::pair{6, 2}})  // groups 1, 2, 3
          for (float p : {0.0f, 0.1f})
            for (DType t : kTypes) {
              const AttnCase k{2, T, HS, NH, NKV, p};
              CAPTURE(threads);
              CAPTURE(T);
              CAPTURE(HS);
              CAPTURE(NH);
              CAPTURE(NKV);
              CAPTURE(p);
              CAPTURE(ops::dtype_name(t));
              check_case(k, t, seed += 3);
            }
  }
}

TEST_CASE("native16 attention: a null dqkv is skipped") {
  const ops::Heads hd(2);
  const V16 qkv = rand16(5 * 24, DType::BF16, 3, 1.0f), dout = rand16(5 * 8, DType::BF16, 4, 1.0f);
  const VF lse(10);
  cpu().run(ops::k::AttentionBackward(nullptr, dout.data(), qkv.data(), lse.data(), 1, 5, 8, hd, {}, nullptr), DType::BF16);
  CHECK(ops::native16_available(cpu(), DType::BF16));
}

namespace {

using Run = test_support::TrainSteps;


}  // namespace

TEST_CASE("native16 attention: small models train bit for bit as on the widened path, in less workspace") {
  for (bool llama : {false, true}) {
    CAPTURE(llama);
    // C = 48 over 2 heads of 24 (Llama: 6 query heads of 8 over 2 key-value heads, group 3);
    // T = 70 (no multiple of 16 or of the block); a narrow MLP, so the attention's fp32 copies
    // are the widened path's largest.
    runner::ModelConfig m = test_support::small_model(61, 70, 48, llama ? 6 : 2, 2);
    if (llama) {
      test_support::make_llama(m);
      m.n_kv_heads = 2;
    }
    m.dropout = 0.1;
    m.mlp_ratio = 1.0;
    const int64_t B = 3, N = B * m.seq_len, C = m.d_model, HS = C / m.n_heads;
    const int64_t W = C + 2 * m.kv_heads() * HS;
    // The Linears on oneDNN's path where it is available (they read 16 bits as stored), so
    // that the attention's copies, not a widened Linear's, set the widened path's peak.
    const ops::GemmPaths paths = ops::choose_gemm_paths(ops::GemmMode::OneDnn);
    ops::ScopedGemmPaths scope(paths);
    for (DType t : kTypes) {
      CAPTURE(ops::dtype_name(t));
      const Run off = test_support::train_steps_native16(m, t, false, 3, B),
                on = test_support::train_steps_native16(m, t, true, 3, B);
      test_support::check_same_bits(on, off);
      CHECK(on.workspace_peak <= off.workspace_peak);
      if (!ops::reads_as_stored(paths.of(t).path)) continue;  // a widened Linear may set both peaks
      // The widened attention's backward holds fp32 copies of qkv, dout and dqkv at once; the
      // native one none.
      const size_t widened_attention = static_cast<size_t>(N * (W + C + W)) * sizeof(float);
      CAPTURE(on.workspace_peak);
      CAPTURE(off.workspace_peak);
      CAPTURE(widened_attention);
      CHECK(on.workspace_peak < off.workspace_peak);
      CHECK(off.workspace_peak >= widened_attention);
      CHECK(on.workspace_peak < widened_attention);
    }
  }
}
