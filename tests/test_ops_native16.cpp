// The 16-bit-native memory-bound kernels (ops/cpu/native16.h) against the
// widened path they replace, bit for bit.
//
// 1. Each Backend::*16 entry point against what the executor's widened path computes from the
//    same 16-bit tensors: widen, the fp32 kernel, round the outputs; an activation gradient
//    (prefilled with random values, so the fold is exercised) := RNE(d + g), g the fp32
//    kernel's gradient accumulated into zeros; fp32 parameter gradients and statistics
//    (prefilled too) compared as they are. bf16 and fp16, sizes that are not multiples of 16
//    and span several tiles (and several of the norms' reduction blocks).
// 2. Small models (GPT-2 style: embedding with positions, layernorm, gelu, dropout, add;
//    Llama style: rmsnorm, swiglu, rope) trained a few steps in bf16 and fp16 with the switch on
//    and off: identical losses and gradients, the dry run exact in both modes, and less
//    workspace with native kernels (so a switch that silently stopped working fails here).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/executor.h"
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

VF rand_f(int64_t n, uint64_t seed, float scale = 1.0f) {
  VF f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[static_cast<size_t>(i)] = scale * (2.0f * ops::rng_uniform(seed, i) - 1.0f);
  return f;
}
V16 round16(const VF& f, DType t) {
  V16 h(f.size());
  ops::from_f32(h.data(), t, f.data(), static_cast<int64_t>(f.size()));
  return h;
}
V16 rand16(int64_t n, DType t, uint64_t seed, float scale = 1.0f) { return round16(rand_f(n, seed, scale), t); }
VF widen(const V16& h, DType t) {
  VF f(h.size());
  ops::to_f32(f.data(), h.data(), t, static_cast<int64_t>(h.size()));
  return f;
}
// d := RNE(d + g): the executor's fold of an fp32 kernel gradient into a 16-bit one.
void fold(V16& d, const VF& g, DType t) { cpu().run(ops::k::Accumulate(d.data(), t, g.data(), static_cast<int64_t>(d.size()))); }
VF zeros(size_t n) { return VF(n, 0.0f); }

using test_support::same_bits;

const DType kTypes[] = {DType::BF16, DType::F16};

}  // namespace

TEST_CASE("native16 pointwise kernels (gelu, relu2, add, dropout) are bit-identical to the widened path") {
  const int64_t n = 12347;  // odd, past one tile (8192)
  for (DType t : kTypes) {
    CAPTURE(ops::dtype_name(t));
    const V16 x = rand16(n, t, 1, 4.0f), y = rand16(n, t, 2), dy = rand16(n, t, 3), d0 = rand16(n, t, 4);
    const VF wx = widen(x, t), wy = widen(y, t), wdy = widen(dy, t);
    V16 out(n);
    VF f(n);
    // gelu
    cpu().run(ops::k::GeluForward(out.data(), x.data(), n), t);
    cpu().run(ops::k::GeluForward(f.data(), wx.data(), n));
    CHECK(same_bits(out, round16(f, t)));
    V16 d = d0, dref = d0;
    cpu().run(ops::k::GeluBackward(d.data(), x.data(), dy.data(), n), t);
    VF g = zeros(n);
    cpu().run(ops::k::GeluBackward(g.data(), wx.data(), wdy.data(), n));
    fold(dref, g, t);
    CHECK(same_bits(d, dref));
    // relu2
    cpu().run(ops::k::Relu2Forward(out.data(), x.data(), n), t);
    cpu().run(ops::k::Relu2Forward(f.data(), wx.data(), n));
    CHECK(same_bits(out, round16(f, t)));
    d = d0, dref = d0;
    cpu().run(ops::k::Relu2Backward(d.data(), x.data(), dy.data(), n), t);
    g = zeros(n);
    cpu().run(ops::k::Relu2Backward(g.data(), wx.data(), wdy.data(), n));
    fold(dref, g, t);
    CHECK(same_bits(d, dref));
    // add, and its backward's add_inplace
    cpu().run(ops::k::AddForward(out.data(), x.data(), y.data(), n), t);
    cpu().run(ops::k::AddForward(f.data(), wx.data(), wy.data(), n));
    CHECK(same_bits(out, round16(f, t)));
    d = d0, dref = d0;
    cpu().run(ops::k::AddInplace(d.data(), dy.data(), n), t);
    g = zeros(n);
    cpu().run(ops::k::AddInplace(g.data(), wdy.data(), n));
    fold(dref, g, t);
    CHECK(same_bits(d, dref));
    // dropout, with and without dropping (the mask counters continue across tiles)
    for (float p : {0.0f, 0.3f}) {
      CAPTURE(p);
      ops::DropoutSpec drop;
      drop.p = p;
      drop.key = 77;
      drop.offset = 1001;
      cpu().run(ops::k::DropoutForward(out.data(), x.data(), n, drop), t);
      cpu().run(ops::k::DropoutForward(f.data(), wx.data(), n, drop));
      CHECK(same_bits(out, round16(f, t)));
      d = d0, dref = d0;
      cpu().run(ops::k::DropoutBackward(d.data(), dy.data(), n, drop), t);
      g = zeros(n);
      cpu().run(ops::k::DropoutBackward(g.data(), wdy.data(), n, drop));
      fold(dref, g, t);
      CHECK(same_bits(d, dref));
    }
  }
}

TEST_CASE("native16 swiglu and rope are bit-identical to the widened path") {
  for (DType t : kTypes) {
    CAPTURE(ops::dtype_name(t));
    {  // swiglu: 37 rows of [gate | up], H = 301 (several rows per tile, several tiles)
      const int N = 37, H = 301;
      const int64_t ni = int64_t{N} * 2 * H, no = int64_t{N} * H;
      const V16 x = rand16(ni, t, 5, 3.0f), dy = rand16(no, t, 6), d0 = rand16(ni, t, 7);
      V16 out(no);
      VF f(no);
      cpu().run(ops::k::SwigluForward(out.data(), x.data(), N, H), t);
      cpu().run(ops::k::SwigluForward(f.data(), widen(x, t).data(), N, H));
      CHECK(same_bits(out, round16(f, t)));
      V16 d = d0, dref = d0;
      cpu().run(ops::k::SwigluBackward(d.data(), dy.data(), x.data(), N, H), t);
      VF g = zeros(ni);
      cpu().run(ops::k::SwigluBackward(g.data(), widen(dy, t).data(), widen(x, t).data(), N, H));
      fold(dref, g, t);
      CHECK(same_bits(d, dref));
    }
    {  // rope: grouped-query heads (4 q over 2 kv), head size 10, T = 7
      const int B = 3, T = 7, NH = 4, NKV = 2, HS = 10, C = NH * HS;
      const ops::Heads heads = ops::Heads::grouped(NH, NKV);
      const int64_t n = int64_t{B} * T * (C + 2 * NKV * HS);
      const V16 x = rand16(n, t, 8), d0 = rand16(n, t, 9);
      V16 out(n);
      VF f(n);
      cpu().run(ops::k::RopeForward(out.data(), x.data(), B, T, C, heads, 10000.0f), t);
      cpu().run(ops::k::RopeForward(f.data(), widen(x, t).data(), B, T, C, heads, 10000.0f));
      CHECK(same_bits(out, round16(f, t)));
      V16 d = d0, dref = d0;
      cpu().run(ops::k::RopeBackward(d.data(), x.data(), B, T, C, heads, 10000.0f), t);
      VF g = zeros(n);
      cpu().run(ops::k::RopeBackward(g.data(), widen(x, t).data(), B, T, C, heads, 10000.0f));
      fold(dref, g, t);
      CHECK(same_bits(d, dref));
    }
  }
}

TEST_CASE("native16 layernorm and rmsnorm are bit-identical to the widened path (several reduction blocks)") {
  const int N = 800, C = 43;  // 43 wide: 381-row reduction blocks, three of them
  const int64_t n = int64_t{N} * C;
  for (DType t : kTypes) {
    CAPTURE(ops::dtype_name(t));
    const V16 x = rand16(n, t, 10, 2.0f), dy = rand16(n, t, 11), d0 = rand16(n, t, 12);
    const VF w = rand_f(C, 13), b = rand_f(C, 14), dw0 = rand_f(C, 15), db0 = rand_f(C, 16);
    const VF wx = widen(x, t), wdy = widen(dy, t);
    V16 out(n);
    VF f(n), mean(N), rstd(N), mref(N), rref(N);
    cpu().run(ops::k::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f), t);
    cpu().run(ops::k::LayerNormForward(f.data(), mref.data(), rref.data(), wx.data(), w.data(), b.data(), N, C, 1e-5f));
    CHECK(same_bits(out, round16(f, t)));
    CHECK(same_bits(mean, mref));
    CHECK(same_bits(rstd, rref));
    V16 d = d0, dref = d0;
    VF dw = dw0, db = db0, dwr = dw0, dbr = db0, g = zeros(n);
    cpu().run(ops::k::LayerNormBackward(d.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                               rstd.data(), N, C), t);
    cpu().run(ops::k::LayerNormBackward(g.data(), dwr.data(), dbr.data(), wdy.data(), wx.data(), w.data(), mref.data(),
                             rref.data(), N, C));
    fold(dref, g, t);
    CHECK(same_bits(d, dref));
    CHECK(same_bits(dw, dwr));
    CHECK(same_bits(db, dbr));

    cpu().run(ops::k::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f), t);
    cpu().run(ops::k::RmsNormForward(f.data(), rref.data(), wx.data(), w.data(), N, C, 1e-5f));
    CHECK(same_bits(out, round16(f, t)));
    CHECK(same_bits(rstd, rref));
    d = d0, dref = d0, dw = dw0, dwr = dw0, g = zeros(n);
    cpu().run(ops::k::RmsNormBackward(d.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C), t);
    cpu().run(ops::k::RmsNormBackward(g.data(), dwr.data(), wdy.data(), wx.data(), w.data(), rref.data(), N, C));
    fold(dref, g, t);
    CHECK(same_bits(d, dref));
    CHECK(same_bits(dw, dwr));
    // Only the parameter gradient (no dinp), as a first layer's norm may ask.
    dw = dw0, dwr = dw0;
    cpu().run(ops::k::RmsNormBackward(nullptr, dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C), t);
    cpu().run(ops::k::RmsNormBackward(nullptr, dwr.data(), wdy.data(), wx.data(), w.data(), rref.data(), N, C));
    CHECK(same_bits(dw, dwr));
  }
}

// The tables are stored in t (OpDef::native16_stored): the kernel gathers and widens the rows
// it needs; the reference is the fp32 kernel on the whole tables widened, as the executor's
// widened path runs it. An odd vocabulary and width, a token outside the table (no row: zeros
// plus the position), with and without learned positions, at 1, 2 and 3 threads (the tiles are
// shared out over the team).
TEST_CASE("native16 embedding is bit-identical to the widened path (tiles inside and across sequences)") {
  const int V = 23, C = 43;
  const int threads = ops::num_threads();
  for (int nt : {1, 2, 3}) {
    ops::set_num_threads(nt);
    CAPTURE(nt);
    for (DType t : kTypes) {
      CAPTURE(ops::dtype_name(t));
      for (auto [B, T] : {std::pair{2, 300}, std::pair{1, 1600}}) {  // 190-row forward tiles; 1524-row backward ones
        CAPTURE(T);
        const int64_t n = int64_t{B} * T * C;
        std::vector<int32_t> tok(static_cast<size_t>(B) * T);
        for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(ops::rng_uniform(17, i) * V) % V;
        tok[5] = -1;
        const V16 wte = rand16(int64_t{V} * C, t, 18), wpe = rand16(int64_t{T} * C, t, 19);
        const VF wte_f = widen(wte, t), wpe_f = widen(wpe, t);
        for (bool positions : {true, false}) {
          CAPTURE(positions);
          V16 out(n);
          VF f(n);
          cpu().run(ops::k::EmbeddingForward(out.data(), tok.data(), wte.data(), positions ? wpe.data() : nullptr, B, T, C), t);
          cpu().run(ops::k::EmbeddingForward(f.data(), tok.data(), wte_f.data(), positions ? wpe_f.data() : nullptr, B, T, C));
          CHECK(same_bits(out, round16(f, t)));
        }
        const V16 dy = rand16(n, t, 20);
        VF dwte = rand_f(int64_t{V} * C, 21), dwpe = rand_f(int64_t{T} * C, 22), dwte_r = dwte, dwpe_r = dwpe;
        cpu().run(ops::k::EmbeddingBackward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C), t);
        cpu().run(ops::k::EmbeddingBackward(dwte_r.data(), dwpe_r.data(), widen(dy, t).data(), tok.data(), B, T, C));
        CHECK(same_bits(dwte, dwte_r));
        CHECK(same_bits(dwpe, dwpe_r));
      }
    }
  }
  ops::set_num_threads(threads);
}

namespace {

using Run = test_support::TrainSteps;

}  // namespace

TEST_CASE("native16: small models train bit for bit as on the widened path, in less workspace") {
  for (bool llama : {false, true}) {
    CAPTURE(llama);
    runner::ModelConfig m = test_support::small_model(61, 13, 40, 4, 2);  // C = 40, HS = 10: no multiple of 16
    if (llama) test_support::make_llama(m);
    m.dropout = 0.1;
    m.mlp_ratio = 7.3;  // an odd hidden width (292), wide enough that the MLP's copies set the widened peak
    for (DType t : kTypes) {
      CAPTURE(ops::dtype_name(t));
      const Run off = test_support::train_steps_native16(m, t, false, 3, 3),
                on = test_support::train_steps_native16(m, t, true, 3, 3);
      test_support::check_same_bits(on, off);
      CHECK(on.workspace_peak < off.workspace_peak);
    }
  }
}

// The embedding reads its 16-bit tables as stored (OpDef::native16_stored): with
// a large vocabulary the widened path's fp32 copy of wte (V x C x 4 bytes, made by every forward
// and backward call) dominates the workspace. A first pipeline stage (embedding and blocks, no
// head: a tied head on the sgemm path widens the same table for its own GEMM, which would set
// the peak in both modes) trained 3 steps, native on and off: the same stage outputs and
// gradients bit for bit, the dry run exact at every step in both modes, and no table-sized
// fp32 buffer with native on (the blocks set that peak); the stage of the embedding alone
// (layers [0, 0)) holds at least the widened table less. Also with 16-bit gradient buffers, whose
// table gradient still goes through the executor's widened fold (a zeroed fp32 copy of dwte,
// rounded into the buffer once), so that the peaks there differ by the forward's copy only.
namespace {

struct StageRun {
  std::vector<std::vector<char>> outs;    // the stage output, per step, as stored
  std::vector<std::vector<float>> grads;  // the last step's parameter gradients
  size_t workspace_peak = 0;              // the largest step's
};

// The first stage's layers are [0, layers).
StageRun train_first_stage(const runner::ModelConfig& m, DType act, DType grad, bool native, int steps,
                           int64_t layers) {
  ops::set_native16(native);
  ops::Backend& be = test_support::test_device();
  runner::GptSpec spec;
  spec.model = m;
  spec.B = 3;
  spec.act_dtype = act;
  spec.grad_dtype = grad;
  spec.last_stage = false;
  spec.last_layer = layers;
  ops::Graph g = runner::build_gpt_graph(spec);
  REQUIRE(g.stage_output >= 0);
  runner::ParamSet ps = runner::init_params(g, m, 11);
  ops::Executor ex(g, be);
  runner::bind_params(ex, g, ps);
  const ops::MemoryEstimate est = ops::Executor::simulate(g);
  const ops::TensorDesc& od = g.tensors[static_cast<size_t>(g.stage_output)];
  // The pipeline's buffers (outside the workspace account, as the pipeline's own are).
  ops::Tensor out(od.shape, od.dtype, ops::Account::Communication), dout(od.shape, od.dtype, ops::Account::Communication);
  std::vector<ops::Tensor> mom, vel;
  for (auto& p : ps.values) {
    mom.push_back(ops::Tensor::zeros(p.shape(), DType::F32, ops::Account::Optimizer));
    vel.push_back(ops::Tensor::zeros(p.shape(), DType::F32, ops::Account::Optimizer));
  }
  auto& mt = ops::MemoryTracker::instance();
  StageRun r;
  for (int s = 0; s < steps; ++s) {
    auto [tok, tgt] = test_support::random_tokens(spec.B * m.seq_len + s, m.vocab_size);
    test_support::set_values(dout, rand_f(dout.numel(), 40 + s, 1e-2f));
    for (auto& gr : ps.grads) be.mem_zero(gr.raw(), gr.nbytes());
    const size_t ws0 = mt.current(ops::Account::Workspace);
    mt.reset_peaks();
    ex.forward(tok.data() + s, nullptr, true, 100 + s, 0, nullptr, out.raw());
    ex.backward(1.0f, dout.raw(), nullptr);
    const size_t peak = mt.peak(ops::Account::Workspace) - ws0;
    CHECK(peak == est.peak[static_cast<int>(ops::Account::Workspace)]);
    r.workspace_peak = std::max(r.workspace_peak, peak);
    r.outs.push_back(test_support::host_bytes(out));
    ops::Backend::AdamwArgs args;  // the next step reads the updated 16-bit tables
    args.lr = 1e-2f, args.beta1 = 0.9f, args.beta2 = 0.95f, args.eps = 1e-8f, args.t = s + 1;
    for (size_t i = 0; i < ps.values.size(); ++i)
      be.run(ops::k::AdamwUpdateTyped(ps.values[i].raw(), ps.values[i].dtype(), ps.grads[i].raw(), ps.grads[i].dtype(),
                            nullptr, mom[i].data<float>(), vel[i].data<float>(), ps.values[i].numel(), args));
  }
  for (auto& t : ps.grads) r.grads.push_back(test_support::host_values(t));
  ops::set_native16(true);
  return r;
}

}  // namespace

TEST_CASE("native16: a large-vocabulary GPT reads its token table as stored") {
  const int64_t V = 5000, C = 64;
  const runner::ModelConfig m = test_support::small_model(V, 13, C, 4, 2);
  const size_t table = static_cast<size_t>(V * C) * sizeof(float);
  for (DType t : kTypes) {
    for (DType grad : {DType::F32, t}) {
      CAPTURE(std::string(ops::dtype_name(t)));
      CAPTURE(std::string(ops::dtype_name(grad)));
      for (int64_t layers : {int64_t{2}, int64_t{0}}) {
        CAPTURE(layers);
        const StageRun off = train_first_stage(m, t, grad, false, 3, layers),
                       on = train_first_stage(m, t, grad, true, 3, layers);
        REQUIRE(off.outs.size() == on.outs.size());
        for (size_t s = 0; s < on.outs.size(); ++s) {
          CAPTURE(s);
          CHECK(same_bits(on.outs[s], off.outs[s]));
        }
        REQUIRE(on.grads.size() == off.grads.size());
        for (size_t i = 0; i < on.grads.size(); ++i) {
          CAPTURE(i);
          CHECK(same_bits(on.grads[i], off.grads[i]));
        }
        CAPTURE(on.workspace_peak);
        CAPTURE(off.workspace_peak);
        if (layers == 0) {  // the embedding alone: its copies are the whole difference
          CHECK(on.workspace_peak + table <= off.workspace_peak);
        } else {  // with fp32 gradients no table-sized buffer at all; the blocks may set the native peak
          CHECK(off.workspace_peak >= table);
          if (grad == DType::F32) CHECK(on.workspace_peak < table);
        }
      }
    }
  }
}
