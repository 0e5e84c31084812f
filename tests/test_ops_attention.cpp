// Attention-family operators (causal self-attention with dropout on the probabilities,
// rotary position embedding) against double references, driven by tables of cases
// (gradcheck.h), plus the properties the training loop relies on: causality, dropout
// determinism and its counter convention, rotation invariants; and the KV cache's decode
// kernel against the training attention.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/cpu/attention.h"
#include "ops/cpu/small_gemm.h"
#include "ops/kv_cache.h"
#include "ops/strict/strict_backend.h"
#include "tests/gradcheck.h"

using namespace gc;

namespace {

// Sets the attention block size for one scope, so that small T still crosses block edges.
struct BlockRows {
  int saved;
  explicit BlockRows(int rows) : saved(ops::cpu::attention_block_rows()) {
    if (rows > 0) ops::cpu::set_attention_block_rows(rows);
  }
  ~BlockRows() { ops::cpu::set_attention_block_rows(saved); }
};

double keep_scale(const ops::DropoutSpec& d, uint64_t counter) {
  if (d.p <= 0) return 1.0;
  return ops::rng_uniform(d.key, d.offset + counter) >= d.p ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0;
}

// out (B,T,C) from qkv (B,T,3C): softmax(q k^T / sqrt(HS)) causal, dropout on the
// probabilities with counter offset + ((b*NH + h)*T + t)*T + s, times v. probs: (B,NH,T,T)
// pre-dropout; lse: (B,NH,T) each row's log(sum_s exp(score)).
DVec ref_attention(const DVec& qkv, int B, int T, int C, int NH, ops::DropoutSpec drop, DVec* probs = nullptr,
                   DVec* lse = nullptr) {
  const int HS = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  DVec out(static_cast<size_t>(B) * T * C, 0.0);
  if (probs) probs->assign(static_cast<size_t>(B) * NH * T * T, 0.0);
  if (lse) lse->assign(static_cast<size_t>(B) * NH * T, 0.0);
  DVec p(T);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * HS + i];
  };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        double mx = -1e300;
        for (int s = 0; s <= t; s++) {
          double d = 0;
          for (int i = 0; i < HS; i++) d += at(b, t, 0, h, i) * at(b, s, 1, h, i);
          p[s] = d * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; s++) sum += (p[s] = std::exp(p[s] - mx));
        const uint64_t row = ((static_cast<uint64_t>(b) * NH + h) * T + t) * T;
        if (lse) (*lse)[row / T] = mx + std::log(sum);
        for (int s = 0; s <= t; s++) {
          p[s] /= sum;
          if (probs) (*probs)[row + s] = p[s];
          const double pd = p[s] * keep_scale(drop, row + s);
          for (int i = 0; i < HS; i++) out[(static_cast<size_t>(b) * T + t) * C + h * HS + i] += pd * at(b, s, 2, h, i);
        }
      }
  return out;
}

struct AttnShape {
  int B, T, C, NH;
  float p = 0.0f;     // attention dropout
  int block = 0;      // block rows (0 = the kernel's default)
  uint64_t offset = 0;  // dropout counter offset
};
// T=1, HS not a multiple of 16, B*NH = 1 (the serial path with threaded GEMMs), several
// blocks with a ragged last one, T beyond the default block of 64, dropout on and off.
const AttnShape kAttn[] = {
    {1, 1, 4, 1},          {2, 5, 12, 3},          {1, 8, 16, 2, 0.2f},   {2, 17, 24, 2, 0.1f, 4},
    {1, 70, 16, 2},        {1, 33, 40, 5, 0.3f, 7}, {3, 9, 18, 3, 0.0f, 2}, {1, 40, 8, 1, 0.25f, 16},
    {2, 67, 32, 2, 0.1f},  {2, 6, 8, 2, 0.5f, 4, 1000003},
    {2, 40, 16, 2},  // one block whose padded width (48) exceeds T: the scores go to scratch
};

OpCase attention_case(const AttnShape& s) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH, block = s.block;
  const ops::DropoutSpec drop{s.p, ops::rng_key(5, static_cast<uint64_t>(T), static_cast<uint64_t>(C)), s.offset};
  OpCase c;
  c.name = "attention B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH) + " p=" + std::to_string(s.p) + " block=" + std::to_string(block) +
           (s.offset ? " offset=" + std::to_string(s.offset) : "");
  c.inputs = {{"qkv", randn(static_cast<size_t>(B) * T * 3 * C, 500 + T * C + B, 0.8f)}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_attention(a[0], B, T, C, NH, drop); };
  c.forward = [=](const std::vector<Vec>& a) {
    BlockRows br(block);
    Vec out(static_cast<size_t>(B) * T * C, 9.0f), lse(static_cast<size_t>(B) * NH * T, 9.0f);
    be().run(ops::k::AttentionForward(out.data(), lse.data(), a[0].data(), B, T, C, NH, drop));
    return out;
  };
  // With p > 0 the backward must regenerate exactly the forward's mask, or it disagrees with
  // the finite differences of the reference (which uses the forward's mask).
  c.backward = [=](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    BlockRows br(block);
    Vec out(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T);
    be().run(ops::k::AttentionForward(out.data(), lse.data(), a[0].data(), B, T, C, NH, drop));
    be().run(ops::k::AttentionBackward(g[0], dout.data(), a[0].data(), lse.data(), B, T, C, NH, drop));
  };
  c.max_coords = 250;
  return c;
}

// Rotary embedding, "rotate half": pairs (i, i + HS/2), angle t * theta^(-2i/HS).
DVec ref_rope(const DVec& x, int B, int T, int C, int NH, double theta) {
  const int HS = C / NH, half = HS / 2;
  DVec out = x;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int hh = 0; hh < 2 * NH; hh++)  // q heads, then k heads
        for (int i = 0; i < half; i++) {
          const size_t base = (static_cast<size_t>(b) * T + t) * 3 * C + static_cast<size_t>(hh) * HS;
          const double a = t * std::pow(theta, -2.0 * i / HS);
          const double x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = x1 * std::cos(a) - x2 * std::sin(a);
          out[base + i + half] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  return out;
}

struct RopeShape {
  int B, T, C, NH;
  float theta;
};
// T up to 300 checks that the angles are accurate at large t (an fp32 t*f would not be).
const RopeShape kRope[] = {{1, 1, 2, 1, 10000.0f}, {2, 5, 16, 2, 10000.0f}, {1, 37, 24, 3, 500.0f},
                           {2, 130, 64, 4, 10000.0f}, {1, 300, 12, 2, 10000.0f}};

OpCase rope_case(const RopeShape& s) {
  const int B = s.B, T = s.T, C = s.C, NH = s.NH;
  const float theta = s.theta;
  OpCase c;
  c.name = "rope B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " NH=" + std::to_string(NH);
  c.inputs = {{"qkv", randn(static_cast<size_t>(B) * T * 3 * C, 600 + T + C)}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_rope(a[0], B, T, C, NH, theta); };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out(a[0].size(), 3.0f);
    be().run(ops::k::RopeForward(out.data(), a[0].data(), B, T, C, NH, theta));
    return out;
  };
  c.backward = [=](const std::vector<Vec>&, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::RopeBackward(g[0], dout.data(), B, T, C, NH, theta));
  };
  return c;
}

}  // namespace

TEST_CASE("attention: forward and backward against double reference (with and without dropout)") {
  for (const AttnShape& s : kAttn) run_case(attention_case(s));
}

TEST_CASE("attention: the saved log-sum-exp is each row's, and no (T,T) buffer is written") {
  // lse[t] = log(sum_{s<=t} exp(score[t][s])) of the scaled causal scores (pre-dropout), so
  // that exp(score - lse) are the probabilities. Its error is fp32 rounding of the scores
  // (|score| <~ 4 here, HS = 6 products) and of one log: 1e-5 absolute has two orders of margin.
  const int B = 2, T = 19, C = 12, NH = 2;
  BlockRows br(5);
  const Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 11);
  const size_t nl = static_cast<size_t>(B) * NH * T;
  Vec out(static_cast<size_t>(B) * T * C), lse(nl + 64, 7.0f);  // 64 guard floats past (B,NH,T)
  const ops::DropoutSpec drop{0.4f, 99};
  be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH, drop));
  DVec rl;
  ref_attention(to_double(qkv), B, T, C, NH, drop, nullptr, &rl);
  double worst = 0;
  for (size_t i = 0; i < nl; i++) worst = std::max(worst, std::fabs(lse[i] - rl[i]));
  CHECK(worst < 1e-5);
  for (size_t i = nl; i < lse.size(); i++) REQUIRE(lse[i] == 7.0f);  // exactly (B,NH,T) written
  // Row 0 has one key: its lse is its score, q0.k0 / sqrt(HS).
  CHECK(lse[0] == doctest::Approx(rl[0]).epsilon(1e-6));
}

TEST_CASE("attention: GPT-sized shape (B=2, T=256, C=384, NH=6) against double reference") {
  // Default block size, both threads; FD on a handful of coordinates (each costs two full
  // double forwards).
  const AttnShape s{2, 256, 384, 6, 0.1f, 0};
  OpCase c = attention_case(s);
  c.max_coords = 6;
  run_case(c);
}

TEST_CASE("attention: causal mask — future tokens do not change earlier outputs") {
  const int B = 2, T = 40, C = 32, NH = 4, t0 = 17;
  for (int block : {0, 8}) {
    BlockRows br(block);
    for (float p : {0.0f, 0.2f}) {
      const ops::DropoutSpec drop{p, 321};
      Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 12);
      Vec out1(static_cast<size_t>(B) * T * C), out2(out1.size()), lse(static_cast<size_t>(B) * NH * T);
      be().run(ops::k::AttentionForward(out1.data(), lse.data(), qkv.data(), B, T, C, NH, drop));
      const Vec other = randn(qkv.size(), 13, 5.0f);
      for (int b = 0; b < B; b++)
        for (int t = t0 + 1; t < T; t++)
          for (int i = 0; i < 3 * C; i++) {
            const size_t k = (static_cast<size_t>(b) * T + t) * 3 * C + i;
            qkv[k] = other[k];
          }
      be().run(ops::k::AttentionForward(out2.data(), lse.data(), qkv.data(), B, T, C, NH, drop));
      for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
          const float* a = &out1[(static_cast<size_t>(b) * T + t) * C];
          const float* z = &out2[(static_cast<size_t>(b) * T + t) * C];
          bool same = true;
          for (int i = 0; i < C; i++) same = same && a[i] == z[i];
          if (t <= t0) REQUIRE(same);  // bit-identical: masked terms contribute exact zeros
          if (t > t0) REQUIRE(!same);
        }
    }
  }
}

TEST_CASE("attention: dropout determinism, counter convention and keep fraction") {
  // With HS >= T and v_s = e_s (one-hot), out[t][s] = Pd[t][s] = P[t][s] * keep / (1-p),
  // which exposes the dropout mask of every (b, h, t, s).
  const int B = 4, T = 64, NH = 2, HS = 64, C = NH * HS;
  const float p = 0.3f;
  Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 14, 0.3f);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++)
        for (int i = 0; i < HS; i++) qkv[(static_cast<size_t>(b) * T + t) * 3 * C + 2 * C + h * HS + i] = i == t;
  const size_t nout = static_cast<size_t>(B) * T * C, nlse = static_cast<size_t>(B) * NH * T;
  Vec a(nout), b2(nout), c2(nout), d(nout), e(nout), lse(nlse);
  be().run(ops::k::AttentionForward(a.data(), lse.data(), qkv.data(), B, T, C, NH, {p, 1000}));
  be().run(ops::k::AttentionForward(b2.data(), lse.data(), qkv.data(), B, T, C, NH, {p, 1000}));
  be().run(ops::k::AttentionForward(c2.data(), lse.data(), qkv.data(), B, T, C, NH, {p, 1001}));
  CHECK(a == b2);  // same key: bit-identical
  CHECK(a != c2);  // another key: another mask
  // p = 0 ignores the key and equals no dropout.
  be().run(ops::k::AttentionForward(d.data(), lse.data(), qkv.data(), B, T, C, NH, {0.0f, 1000}));
  be().run(ops::k::AttentionForward(e.data(), lse.data(), qkv.data(), B, T, C, NH, {0.0f, 0}));
  CHECK(d == e);
  // The mask is rng_uniform(key, ((b*NH + h)*T + t)*T + s) >= p, the documented counter. The
  // probabilities are the double reference's (the kernel keeps none): a kept entry is P/(1-p)
  // within fp32 rounding (1e-5 relative), a dropped one exactly 0 (v is one-hot, so the other
  // products are exact zeros).
  be().run(ops::k::AttentionForward(a.data(), lse.data(), qkv.data(), B, T, C, NH, {p, 1000}));
  DVec ref_probs;
  ref_attention(to_double(qkv), B, T, C, NH, {}, &ref_probs);
  int64_t kept = 0, total = 0, mismatches = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int s = 0; s <= t; s++) {
          const uint64_t ctr = ((static_cast<uint64_t>(b) * NH + h) * T + t) * T + s;
          const double P = ref_probs[ctr];
          const float pd = a[(static_cast<size_t>(b) * T + t) * C + h * HS + s];
          const bool keep = ops::rng_uniform(1000, ctr) >= p;
          total++;
          kept += keep;
          const double want = keep ? P / (1.0 - p) : 0.0;
          mismatches += keep ? std::fabs(pd - want) > 1e-5 * want : pd != 0.0f;
        }
  CHECK(mismatches == 0);
  // Binomial(total ~ 16640, 0.7): std of the fraction ~ 3.6e-3; allow 5 sigma.
  CHECK(std::fabs(static_cast<double>(kept) / total - (1.0 - p)) < 0.018);
}

TEST_CASE("attention: a micro-batch at its offset reproduces its rows of the full batch") {
  // The dropout offset of batch row b0 is b0*NH*T*T: running rows one at a time gives the
  // same outputs and gradients, bit for bit, as running the whole batch.
  const int B = 3, T = 21, C = 24, NH = 3;
  const ops::DropoutSpec drop{0.3f, 777, 5};
  const size_t nq = static_cast<size_t>(T) * 3 * C, no = static_cast<size_t>(T) * C, np = static_cast<size_t>(NH) * T * T;
  const size_t nl = static_cast<size_t>(NH) * T;
  const Vec qkv = randn(B * nq, 40), dout = randn(B * no, 41);
  Vec out(B * no), lse(B * nl), dqkv(B * nq, 0.0f);
  be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH, drop));
  be().run(ops::k::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C, NH, drop));
  for (int b = 0; b < B; b++) {
    const ops::DropoutSpec d1{drop.p, drop.key, drop.offset + static_cast<uint64_t>(b) * np};
    Vec o1(no), p1(nl), g1(nq, 0.0f);
    be().run(ops::k::AttentionForward(o1.data(), p1.data(), qkv.data() + b * nq, 1, T, C, NH, d1));
    be().run(ops::k::AttentionBackward(g1.data(), dout.data() + b * no, qkv.data() + b * nq, p1.data(), 1, T, C, NH, d1));
    CHECK(std::equal(o1.begin(), o1.end(), out.begin() + b * no));
    CHECK(std::equal(p1.begin(), p1.end(), lse.begin() + b * nl));
    CHECK(std::equal(g1.begin(), g1.end(), dqkv.begin() + b * nq));
  }
}

TEST_CASE("attention: null dqkv is a no-op") {
  const int B = 1, T = 4, C = 8, NH = 2;
  const Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 15), dout = randn(static_cast<size_t>(B) * T * C, 16);
  Vec out(dout.size()), lse(static_cast<size_t>(B) * NH * T);
  be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH, {}));
  be().run(ops::k::AttentionBackward(nullptr, dout.data(), qkv.data(), lse.data(), B, T, C, NH, {}));
}

// The strict device's wrappers (ops/strict): the new signature end to end on device memory,
// grouped-query with its workspace and dropout: out, lse and dqkv bit-identical to the CPU's.
TEST_CASE("attention on the strict device: out, lse and dqkv bit-identical to the CPU backend's") {
  ops::Backend& sd = ops::strict::strict_backend();
  const int B = 2, T = 37, C = 32, NH = 4, HS = C / NH;
  const ops::Heads hd = ops::Heads::grouped(NH, 2);
  const int W = C + 2 * hd.kv * HS;
  const ops::DropoutSpec drop{0.2f, 4242, 7};
  const Vec qkv = randn(static_cast<size_t>(B) * T * W, 71), dout = randn(static_cast<size_t>(B) * T * C, 72);
  const size_t nwork = static_cast<size_t>(ops::k::AttentionBackward::work_floats(B, T, C, hd));
  Vec out(dout.size()), lse(static_cast<size_t>(B) * NH * T), dqkv(qkv.size(), 0.0f), work(nwork);
  be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, hd, drop));
  be().run(ops::k::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C, hd, drop, work.data()));
  auto dev = [&](size_t n) { return static_cast<float*>(sd.mem_alloc(n * sizeof(float))); };
  float *dq = dev(qkv.size()), *ddo = dev(dout.size()), *dout_ = dev(out.size()), *dl = dev(lse.size()),
        *ddq = dev(qkv.size()), *dw = dev(nwork);
  sd.copy_in(dq, qkv.data(), qkv.size() * sizeof(float));
  sd.copy_in(ddo, dout.data(), dout.size() * sizeof(float));
  sd.mem_zero(ddq, qkv.size() * sizeof(float));
  sd.run(ops::k::AttentionForward(dout_, dl, dq, B, T, C, hd, drop));
  sd.run(ops::k::AttentionBackward(ddq, ddo, dq, dl, B, T, C, hd, drop, dw));
  Vec o2(out.size()), l2(lse.size()), g2(qkv.size());
  sd.copy_out(o2.data(), dout_, o2.size() * sizeof(float));
  sd.copy_out(l2.data(), dl, l2.size() * sizeof(float));
  sd.copy_out(g2.data(), ddq, g2.size() * sizeof(float));
  sd.synchronize();
  CHECK(o2 == out);
  CHECK(l2 == lse);
  CHECK(g2 == dqkv);
  for (auto [p, n] : {std::pair{dq, qkv.size()}, {ddo, dout.size()}, {dout_, out.size()}, {dl, lse.size()},
                      {ddq, qkv.size()}, {dw, nwork}})
    sd.mem_free(p, n * sizeof(float));
}

TEST_CASE("rope: forward and backward against double reference") {
  for (const RopeShape& s : kRope) run_case(rope_case(s));
}

TEST_CASE("rope: rotation preserves each pair's norm; backward is the inverse rotation; v passes through") {
  const int B = 2, T = 50, C = 48, NH = 3, HS = C / NH, half = HS / 2;
  const Vec x = randn(static_cast<size_t>(B) * T * 3 * C, 17);
  Vec y(x.size());
  be().run(ops::k::RopeForward(y.data(), x.data(), B, T, C, NH, 10000.0f));
  for (int r = 0; r < B * T; r++) {
    for (int hh = 0; hh < 2 * NH; hh++)
      for (int i = 0; i < half; i++) {
        const size_t k = static_cast<size_t>(r) * 3 * C + static_cast<size_t>(hh) * HS + i;
        const double n0 = std::hypot(x[k], x[k + half]), n1 = std::hypot(y[k], y[k + half]);
        REQUIRE(std::fabs(n1 - n0) <= 1e-6 * std::max(1.0, n0));
      }
    for (int i = 2 * C; i < 3 * C; i++) REQUIRE(y[static_cast<size_t>(r) * 3 * C + i] == x[static_cast<size_t>(r) * 3 * C + i]);
  }
  // t = 0 is the identity rotation.
  for (int i = 0; i < 2 * C; i++) REQUIRE(y[i] == x[i]);
  // R^T R = I: backward of the forward's output recovers the input.
  Vec back(x.size(), 0.0f);
  be().run(ops::k::RopeBackward(back.data(), y.data(), B, T, C, NH, 10000.0f));
  CHECK(rel_err(back, x) < 1e-6);
}

TEST_CASE("small_gemm (attention's per-head GEMM): all tile remainders, transposed A, accumulate") {
  // M covers every row remainder of the 6-row tile, N both the 32- and 16-column tiles, K
  // includes 1. A is read through (sa_i, sa_k) strides, both as stored and transposed.
  for (int M : {1, 5, 6, 7, 13, 64})
    for (int N : {16, 32, 48, 80})
      for (int K : {1, 3, 64, 70})
        for (bool transA : {false, true})
          for (bool acc : {false, true}) {
            INFO("M=" << M << " N=" << N << " K=" << K << " transA=" << transA << " acc=" << acc);
            const int lda = (transA ? M : K) + 3, ldb = N + 16, ldc = N + 32;
            const Vec A = randn(static_cast<size_t>(transA ? K : M) * lda, 50 + M),
                      Bm = randn(static_cast<size_t>(K) * ldb, 51 + N);
            Vec Cm = randn(static_cast<size_t>(M) * ldc, 52 + K);
            const Vec C0 = Cm;
            const int64_t sa_i = transA ? 1 : lda, sa_k = transA ? lda : 1;
            ops::cpu::small_gemm(M, N, K, 0.7f, A.data(), sa_i, sa_k, Bm.data(), ldb, Cm.data(), ldc, acc);
            DVec want(Cm.size());
            for (int i = 0; i < M; i++)
              for (int j = 0; j < ldc; j++) {
                const size_t c = static_cast<size_t>(i) * ldc + j;
                if (j >= N) {  // outside the N columns: untouched
                  want[c] = C0[c];
                  continue;
                }
                double sum = 0;
                for (int k = 0; k < K; k++) sum += static_cast<double>(A[i * sa_i + k * sa_k]) * Bm[static_cast<size_t>(k) * ldb + j];
                want[c] = 0.7 * sum + (acc ? C0[c] : 0.0);
              }
            REQUIRE(rel_err(Cm, want) < 1e-5);
          }
}

// The KV cache's kernels (generation): K and V stored for a prefix, then one query per row at
// its own position, against the training attention over the whole sequence. Rows decode at
// different positions in one call; with rope, the decode kernel rotates at each row's
// position what the training path rotates with rope_forward over the sequence.
TEST_CASE("attention_decode: cached rows at their own positions equal the full attention's rows (fp32, rope)") {
  const int B = 2, T = 9, C = 16, NH = 2;
  for (const float theta : {0.0f, 10000.0f}) {
    CAPTURE(theta);
    const Vec raw = randn(static_cast<size_t>(B) * T * 3 * C, 41);
    Vec qkv = raw;
    if (theta > 0) be().run(ops::k::RopeForward(qkv.data(), raw.data(), B, T, C, NH, theta));
    Vec full(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T);
    be().run(ops::k::AttentionForward(full.data(), lse.data(), qkv.data(), B, T, C, NH, {}));
    ops::KvCache cache(0, 1, B, T, C, NH, ops::DType::F32);
    const int P = 3;  // prefill positions [0, P) of both rows (the roped qkv, as the graph stores it)
    Vec pre(static_cast<size_t>(B) * P * 3 * C);
    for (int b = 0; b < B; b++)
      std::copy_n(qkv.begin() + static_cast<int64_t>(b) * T * 3 * C, P * 3 * C, pre.begin() + static_cast<int64_t>(b) * P * 3 * C);
    be().run(ops::k::KvCacheWrite(cache.layer(0), pre.data(), B, P, C, NH));
    // Row 0 decodes positions P..T-1; row 1 runs one position behind (it repeats P at first).
    double worst = 0;
    for (int s = 0; s < T - P; s++) {
      const int32_t pos[2] = {P + s, P + std::max(0, s - 1)};
      Vec in(static_cast<size_t>(B) * 3 * C), out(static_cast<size_t>(B) * C);
      for (int b = 0; b < B; b++)  // the un-roped row: the kernel rotates it at pos[b]
        std::copy_n(raw.begin() + (static_cast<int64_t>(b) * T + pos[b]) * 3 * C, 3 * C, in.begin() + b * 3 * C);
      be().run(ops::k::AttentionDecode(out.data(), in.data(), cache.layer(0), pos, B, C, NH, theta));
      for (int b = 0; b < B; b++)
        for (int i = 0; i < C; i++)
          worst = std::max(worst, static_cast<double>(std::fabs(out[static_cast<size_t>(b * C + i)] -
                                                                full[(static_cast<size_t>(b) * T + pos[b]) * C + i])));
    }
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("attention_decode: 16-bit and int8 caches read back within their formats' rounding") {
  const int B = 1, T = 6, C = 16, NH = 2;
  const Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 43);
  Vec full(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * NH * T);
  be().run(ops::k::AttentionForward(full.data(), lse.data(), qkv.data(), B, T, C, NH, {}));
  // Output error of one query over 6 positions of unit-variance K and V, per format (measured
  // 1.6e-3 bf16, 3.9e-4 fp16, 4.7e-3 int8): bounds about 5x that.
  const std::vector<std::pair<ops::DType, double>> formats = {
      {ops::DType::BF16, 8e-3}, {ops::DType::F16, 2e-3}, {ops::DType::I8, 2.5e-2}};
  for (const auto& [dt, bound] : formats) {
    CAPTURE(ops::dtype_name(dt));
    ops::KvCache cache(0, 1, B, T, C, NH, dt);
    be().run(ops::k::KvCacheWrite(cache.layer(0), qkv.data(), B, T - 1, C, NH));
    const int32_t pos[1] = {T - 1};
    Vec out(static_cast<size_t>(C));
    be().run(ops::k::AttentionDecode(out.data(), qkv.data() + (T - 1) * 3 * C, cache.layer(0), pos, B, C, NH, 0.0f));
    double worst = 0;
    for (int i = 0; i < C; i++)
      worst = std::max(worst, static_cast<double>(std::fabs(out[static_cast<size_t>(i)] - full[(T - 1) * C + i])));
    MESSAGE(std::string(ops::dtype_name(dt)) << ": max abs output difference " << worst);
    CHECK(worst > 0);
    CHECK(worst < bound);
  }
}
