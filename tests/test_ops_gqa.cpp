// Grouped-query attention's kernels (ops/backend.h, Heads; Ainslie et al. 2023): NH query
// heads over NKV key-value heads, from multi-query (NKV = 1) to full multi-head (NKV = NH).
//   - forward and backward against a double reference by finite differences (gradcheck.h),
//     including the replicated mapping of tensor parallelism (first != 0);
//   - against PyTorch (tests/python/gqa_reference.py: scaled_dot_product_attention with K and V
//     repeat_interleave'd to the query heads, the Hugging Face Llama convention) to 1e-5;
//   - the backward is deterministic whatever the thread count (its group sum has a fixed order);
//   - tensor-parallel head shards (key-value heads split, or replicated) reproduce the whole;
//   - rope rotates NH + NKV heads and copies the NKV value heads;
//   - the KV cache holds the key-value heads only, and decode over it equals the full
//     attention in every format.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "ops/kv_cache.h"
#include "tests/gradcheck.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using namespace gc;
using ops::Heads;

namespace {

double keep_scale(const ops::DropoutSpec& d, uint64_t counter) {
  if (d.p <= 0) return 1.0;
  return ops::rng_uniform(d.key, d.offset + counter) >= d.p ? 1.0 / (1.0 - static_cast<double>(d.p)) : 0.0;
}

int width(int C, Heads hd) { return C + 2 * hd.kv * (C / hd.q); }

// out (B,T,C) from qkv (B,T,W): query head h against key-value head hd.kv_of(h), causal
// softmax, dropout on the probabilities with counter offset + ((b*NH + h)*T + t)*T + s.
DVec ref_gqa(const DVec& qkv, int B, int T, int C, Heads hd, ops::DropoutSpec drop) {
  const int NH = hd.q, HS = C / NH, W = width(C, hd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  DVec out(static_cast<size_t>(B) * T * C, 0.0), p(T);
  auto at = [&](int b, int t, int col) { return qkv[(static_cast<size_t>(b) * T + t) * W + col]; };
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int kc = C + hd.kv_of(h) * HS, vc = kc + hd.kv * HS;
      for (int t = 0; t < T; t++) {
        double mx = -1e300;
        for (int s = 0; s <= t; s++) {
          double d = 0;
          for (int i = 0; i < HS; i++) d += at(b, t, h * HS + i) * at(b, s, kc + i);
          p[s] = d * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; s++) sum += (p[s] = std::exp(p[s] - mx));
        const uint64_t row = ((static_cast<uint64_t>(b) * NH + h) * T + t) * T;
        for (int s = 0; s <= t; s++) {
          const double pd = p[s] / sum * keep_scale(drop, row + s);
          for (int i = 0; i < HS; i++) out[(static_cast<size_t>(b) * T + t) * C + h * HS + i] += pd * at(b, s, vc + i);
        }
      }
    }
  return out;
}

// The fp32 kernels' forward and backward (with the workspace a grouped backward takes).
void run_gqa(Vec& out, Vec& dqkv, const Vec& qkv, const Vec* dout, int B, int T, int C, Heads hd,
             ops::DropoutSpec drop) {
  out.assign(static_cast<size_t>(B) * T * C, 9.0f);
  Vec lse(static_cast<size_t>(B) * hd.q * T, 9.0f);
  be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, hd, drop));
  if (!dout) return;
  Vec work(static_cast<size_t>(ops::k::AttentionBackward::work_floats(B, T, C, hd)), 7.0f);
  be().run(ops::k::AttentionBackward(dqkv.data(), dout->data(), qkv.data(), lse.data(), B, T, C, hd, drop,
                          work.empty() ? nullptr : work.data()));
}

struct GqaShape {
  int B, T, C;
  Heads hd;
  float p = 0.0f;
};
// Multi-query, groups of 2 and 3, full multi-head through the same path, dropout, T across
// the default 64-row block; and the replicated tensor-parallel mapping: a rank with query heads
// 3..5 of (6 query, 2 key-value) (all read key-value head 1) and one with heads 2..3 of the
// same model under tp 3 (its two heads read different key-value heads).
const GqaShape kGqa[] = {
    {2, 7, 16, Heads::grouped(4, 1)},          {2, 9, 16, Heads::grouped(4, 2), 0.2f},
    {1, 70, 16, Heads::grouped(4, 4)},         {2, 11, 24, Heads::grouped(6, 2), 0.1f},
    {1, 5, 12, Heads::grouped(6, 3)},          {2, 8, 12, Heads(3, 2, 3, 3)},
    {2, 6, 8, Heads(2, 2, 3, 2), 0.25f},       {1, 67, 32, Heads::grouped(4, 1), 0.1f},
};

OpCase gqa_case(const GqaShape& s) {
  const int B = s.B, T = s.T, C = s.C;
  const Heads hd = s.hd;
  const ops::DropoutSpec drop{s.p, ops::rng_key(6, static_cast<uint64_t>(T), static_cast<uint64_t>(C))};
  OpCase c;
  c.name = "gqa B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) + " NH=" +
           std::to_string(hd.q) + " NKV=" + std::to_string(hd.kv) + " group=" + std::to_string(hd.group) +
           " first=" + std::to_string(hd.first) + " p=" + std::to_string(s.p);
  c.inputs = {{"qkv", randn(static_cast<size_t>(B) * T * width(C, hd), 700 + T * C + B + hd.kv, 0.8f)}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_gqa(a[0], B, T, C, hd, drop); };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out, none;
    run_gqa(out, none, a[0], nullptr, B, T, C, hd, drop);
    return out;
  };
  c.backward = [=](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    Vec out(static_cast<size_t>(B) * T * C), lse(static_cast<size_t>(B) * hd.q * T);
    be().run(ops::k::AttentionForward(out.data(), lse.data(), a[0].data(), B, T, C, hd, drop));
    Vec work(static_cast<size_t>(ops::k::AttentionBackward::work_floats(B, T, C, hd)));
    be().run(ops::k::AttentionBackward(g[0], dout.data(), a[0].data(), lse.data(), B, T, C, hd, drop,
                            work.empty() ? nullptr : work.data()));
  };
  c.max_coords = 250;
  return c;
}

template <class T>
void write_raw(const std::filesystem::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

}  // namespace

TEST_CASE("grouped-query attention: forward and backward against a double reference (1, 2, 3 and all heads per group)") {
  for (const GqaShape& s : kGqa) run_case(gqa_case(s));
}

TEST_CASE("grouped-query attention: against PyTorch's scaled_dot_product_attention with repeat_interleave, to 1e-5") {
  const test_support::TempDir dir("test_ops_gqa");
  const int B = 2, T = 33, C = 64, NH = 8;
  for (int nkv : {1, 2, 8}) {
    CAPTURE(nkv);
    const Heads hd = Heads::grouped(NH, nkv);
    const Vec qkv = randn(static_cast<size_t>(B) * T * width(C, hd), 800 + nkv), dout = randn(static_cast<size_t>(B) * T * C, 801);
    Vec out, dqkv(qkv.size(), 0.0f);
    run_gqa(out, dqkv, qkv, &dout, B, T, C, hd, {});
    write_raw(dir / "qkv.f32", qkv);
    write_raw(dir / "dout.f32", dout);
    write_raw(dir / "out.f32", out);
    write_raw(dir / "dqkv.f32", dqkv);
    const test_support::Result py = test_support::sh(
        "/usr/bin/python3 " + std::string(RUNNER_TEST_DIR) + "/python/gqa_reference.py " + dir.string() + " " +
        std::to_string(B) + " " + std::to_string(T) + " " + std::to_string(C) + " " + std::to_string(NH) + " " +
        std::to_string(nkv));
    MESSAGE(py.out);
    CHECK(py.code == 0);
  }
}

TEST_CASE("grouped-query attention: the backward's group sum does not depend on the thread count") {
  const int B = 2, T = 40, C = 32;
  const Heads hd = Heads::grouped(8, 2);
  const ops::DropoutSpec drop{0.1f, 31};
  const Vec qkv = randn(static_cast<size_t>(B) * T * width(C, hd), 810), dout = randn(static_cast<size_t>(B) * T * C, 811);
  const int threads = ops::num_threads();
  Vec ref;
  for (int n : {1, 2, 3}) {
    ops::set_num_threads(n);
    Vec out, dqkv(qkv.size(), 0.0f);
    run_gqa(out, dqkv, qkv, &dout, B, T, C, hd, drop);
    if (ref.empty()) ref = dqkv;
    CHECK(dqkv == ref);
  }
  ops::set_num_threads(threads);
}

// Tensor parallelism over query-head shards: with tp dividing the key-value heads a rank holds
// its own (split); otherwise all of them (replicated, first = its first query head), and the
// ranks' partial key-value gradients add up to the whole model's.
TEST_CASE("grouped-query attention: tensor-parallel head shards, key-value heads split or replicated, reproduce the whole") {
  const int B = 2, T = 12, NH = 6, HS = 4, C = NH * HS;
  for (int nkv : {3, 2, 1}) {
    const int tp = 3;
    CAPTURE(nkv);
    const Heads whole = Heads::grouped(NH, nkv);
    const int W = width(C, whole), group = NH / nkv;
    const bool split = nkv % tp == 0;
    const ops::DropoutSpec drop{0.2f, 77};
    const Vec qkv = randn(static_cast<size_t>(B) * T * W, 820 + nkv), dout = randn(static_cast<size_t>(B) * T * C, 821);
    Vec out, dqkv(qkv.size(), 0.0f);
    run_gqa(out, dqkv, qkv, &dout, B, T, C, whole, drop);
    Vec dkv_sum(qkv.size(), 0.0f);  // the ranks' key-value gradients, summed as tp would
    for (int r = 0; r < tp; r++) {
      const int nq = NH / tp, nk = split ? nkv / tp : nkv, k0 = split ? r * nk : 0, Wl = (nq + 2 * nk) * HS;
      const Heads hd(nq, nk, group, split ? 0 : r * nq);
      ops::DropoutSpec d = drop;
      d.heads_total = NH;
      d.head_start = r * nq;
      // This rank's columns: its query heads, then its (or all) key and value heads.
      std::vector<int> cols;
      for (int i = 0; i < nq * HS; i++) cols.push_back(r * nq * HS + i);
      for (int part = 0; part < 2; part++)
        for (int i = 0; i < nk * HS; i++) cols.push_back(C + part * nkv * HS + k0 * HS + i);
      Vec lq(static_cast<size_t>(B) * T * Wl), ld(static_cast<size_t>(B) * T * nq * HS);
      for (int row = 0; row < B * T; row++) {
        for (int j = 0; j < Wl; j++) lq[static_cast<size_t>(row) * Wl + j] = qkv[static_cast<size_t>(row) * W + cols[j]];
        for (int j = 0; j < nq * HS; j++)
          ld[static_cast<size_t>(row) * nq * HS + j] = dout[static_cast<size_t>(row) * C + r * nq * HS + j];
      }
      Vec lo, lg(lq.size(), 0.0f);
      run_gqa(lo, lg, lq, &ld, B, T, nq * HS, hd, d);
      for (int row = 0; row < B * T; row++) {
        for (int j = 0; j < nq * HS; j++)  // outputs and query gradients: bit for bit
          REQUIRE(lo[static_cast<size_t>(row) * nq * HS + j] == out[static_cast<size_t>(row) * C + r * nq * HS + j]);
        for (int j = 0; j < Wl; j++) {
          const size_t at = static_cast<size_t>(row) * W + cols[j];
          if (j < nq * HS) REQUIRE(lg[static_cast<size_t>(row) * Wl + j] == dqkv[at]);
          else dkv_sum[at] += lg[static_cast<size_t>(row) * Wl + j];
        }
      }
    }
    Vec want(qkv.size(), 0.0f), got(qkv.size(), 0.0f);
    for (int row = 0; row < B * T; row++)
      for (int j = C; j < W; j++) {
        want[static_cast<size_t>(row) * W + j] = dqkv[static_cast<size_t>(row) * W + j];
        got[static_cast<size_t>(row) * W + j] = dkv_sum[static_cast<size_t>(row) * W + j];
      }
    if (split) CHECK(got == want);  // each key-value head lives on one rank: the same sums
    else CHECK(rel_err(got, want) < 1e-6);
  }
}

TEST_CASE("rope with grouped-query attention: NH + NKV heads rotated, the NKV value heads copied") {
  const int B = 2, T = 20, NH = 4, HS = 8, C = NH * HS;
  for (int nkv : {1, 2}) {
    const Heads hd = Heads::grouped(NH, nkv);
    const int W = width(C, hd), half = HS / 2;
    const Vec x = randn(static_cast<size_t>(B) * T * W, 830 + nkv);
    Vec y(x.size());
    be().run(ops::k::RopeForward(y.data(), x.data(), B, T, C, hd, 10000.0f));
    double worst = 0;
    for (int r = 0; r < B * T; r++) {
      const int t = r % T;
      for (int hh = 0; hh < NH + nkv; hh++)
        for (int i = 0; i < half; i++) {
          const size_t k = static_cast<size_t>(r) * W + static_cast<size_t>(hh) * HS + i;
          const double a = t * std::pow(10000.0, -2.0 * i / HS);
          worst = std::max(worst, std::fabs(y[k] - (x[k] * std::cos(a) - x[k + half] * std::sin(a))));
          worst = std::max(worst, std::fabs(y[k + half] - (x[k + half] * std::cos(a) + x[k] * std::sin(a))));
        }
      for (int i = C + nkv * HS; i < W; i++) REQUIRE(y[static_cast<size_t>(r) * W + i] == x[static_cast<size_t>(r) * W + i]);
    }
    CHECK(worst < 1e-5);
    Vec back(x.size(), 0.0f);  // the adjoint undoes the rotation
    be().run(ops::k::RopeBackward(back.data(), y.data(), B, T, C, hd, 10000.0f));
    CHECK(rel_err(back, x) < 1e-6);
  }
}

// The cache stores NKV heads per position (that is the point of grouped-query attention), and
// a decode step over it equals the full attention's row, in every format within its rounding.
TEST_CASE("KV cache with grouped-query attention: NKV heads per position; decode equals the full attention in every format") {
  const int B = 2, T = 8, NH = 4, HS = 4, C = NH * HS, P = 3;
  for (int nkv : {1, 2, 4}) {
    CAPTURE(nkv);
    const Heads hd = Heads::grouped(NH, nkv);
    const int W = width(C, hd);
    const Vec qkv = randn(static_cast<size_t>(B) * T * W, 840 + nkv);
    Vec full;
    Vec none;
    run_gqa(full, none, qkv, nullptr, B, T, C, hd, {});
    const std::vector<std::pair<ops::DType, double>> formats = {
        {ops::DType::F32, 1e-5}, {ops::DType::BF16, 8e-3}, {ops::DType::F16, 2e-3}, {ops::DType::I8, 2.5e-2}};
    for (const auto& [dt, bound] : formats) {
      CAPTURE(ops::dtype_name(dt));
      ops::KvCache cache(0, 1, B, T, nkv * HS, nkv, dt);
      const size_t per_position = static_cast<size_t>(nkv * HS) * ops::dtype_size(dt) + (dt == ops::DType::I8 ? 4u * nkv : 0u);
      CHECK(cache.bytes() == 2 * static_cast<size_t>(B) * T * per_position);
      CHECK(cache.bytes() == ops::KvCache::bytes_for(1, B, T, nkv * HS, nkv, dt));
      Vec pre(static_cast<size_t>(B) * P * W);
      for (int b = 0; b < B; b++)
        std::copy_n(qkv.begin() + static_cast<int64_t>(b) * T * W, P * W, pre.begin() + static_cast<int64_t>(b) * P * W);
      be().run(ops::k::KvCacheWrite(cache.layer(0), pre.data(), B, P, C, hd));
      double worst = 0;
      for (int s = 0; s < T - P; s++) {
        const int32_t pos[2] = {P + s, P + std::max(0, s - 1)};  // row 1 a step behind (repeats P)
        Vec in(static_cast<size_t>(B) * W), o(static_cast<size_t>(B) * C);
        for (int b = 0; b < B; b++) std::copy_n(qkv.begin() + (static_cast<int64_t>(b) * T + pos[b]) * W, W, in.begin() + b * W);
        be().run(ops::k::AttentionDecode(o.data(), in.data(), cache.layer(0), pos, B, C, hd, 0.0f));
        for (int b = 0; b < B; b++)
          for (int i = 0; i < C; i++)
            worst = std::max(worst, static_cast<double>(std::fabs(o[static_cast<size_t>(b * C + i)] -
                                                                  full[(static_cast<size_t>(b) * T + pos[b]) * C + i])));
      }
      CHECK(worst < bound);
    }
  }
}
