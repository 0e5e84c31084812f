// Tensor-parallel kernels (ops/backend.h) against their unsharded counterparts, with the
// tensor-parallel group simulated inside one process: the full tensors are split into
// shards, each shard runs the kernel, and the test performs the group's all-reduces
// itself (max / sum over the shards, in shard order).
//   - vocabulary-parallel cross-entropy (xent_shard_*) == softmax_xent_* on the full logits;
//   - vocabulary-parallel embedding (embedding_shard_*) == embedding_* on the full table;
//   - attention over a head shard (DropoutSpec::heads_total / head_start) == the same heads
//     of the unsharded attention, dropout mask included, bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/attention.h"
#include "tests/gradcheck.h"

using namespace gc;

namespace {

// ============================================================================ cross-entropy
struct XentSplit {
  int N, Vreal, Vfull, shards;
};

// Columns [c0, c0 + n) of a row-major (N, V) matrix.
Vec cols(const Vec& m, int N, int V, int c0, int n) {
  Vec out(static_cast<size_t>(N) * n);
  for (int r = 0; r < N; r++)
    std::copy_n(m.begin() + static_cast<size_t>(r) * V + c0, n, out.begin() + static_cast<size_t>(r) * n);
  return out;
}
void put_cols(Vec& m, int N, int V, int c0, int n, const Vec& part) {
  for (int r = 0; r < N; r++)
    std::copy_n(part.begin() + static_cast<size_t>(r) * n, n, m.begin() + static_cast<size_t>(r) * V + c0);
}

void check_xent_split(const XentSplit& sp) {
  const int N = sp.N, V = sp.Vfull, Vreal = sp.Vreal, S = sp.shards;
  REQUIRE(V % S == 0);
  const int Vl = V / S;
  const float dloss = 0.2f;
  CAPTURE(Vreal);
  CAPTURE(V);
  CAPTURE(S);

  Vec logits = randn(static_cast<size_t>(N) * V, 31 + 7 * S + Vreal, 2.0f);
  for (int r = 0; r < N; r++)  // padding columns hold garbage that must be ignored
    for (int i = Vreal; i < V; i++) logits[static_cast<size_t>(r) * V + i] = 1e4f;
  std::vector<int32_t> tgt(N);
  for (int r = 0; r < N; r++) tgt[r] = (3 * r + 1) % Vreal;  // targets in every shard
  tgt[0] = Vreal - 1;
  tgt[2] = -1;  // an ignored row
  tgt[N - 1] = 0;

  // The unsharded reference.
  Vec loss_full(N), probs_full(logits.size()), d_full(logits.size(), 9.0f);
  be().run(ops::k::SoftmaxXentForward(loss_full.data(), probs_full.data(), logits.data(), tgt.data(), N, V, Vreal));
  be().run(ops::k::SoftmaxXentBackward(d_full.data(), probs_full.data(), tgt.data(), dloss, N, V, Vreal));

  auto shard_real = [&](int k) { return std::clamp(Vreal - k * Vl, 0, Vl); };
  std::vector<Vec> shard_logits(S);
  for (int k = 0; k < S; k++) shard_logits[k] = cols(logits, N, V, k * Vl, Vl);

  // Phase 1 on each shard, all-reduce MAX.
  Vec rowmax(N, -std::numeric_limits<float>::infinity());
  for (int k = 0; k < S; k++) {
    Vec m(N, 5.0f);
    be().run(ops::k::XentShardMax(m.data(), shard_logits[k].data(), N, Vl, shard_real(k)));
    for (int r = 0; r < N; r++) {
      if (shard_real(k) == 0) REQUIRE(m[r] == -std::numeric_limits<float>::infinity());
      rowmax[r] = std::max(rowmax[r], m[r]);
    }
  }
  for (int r = 0; r < N; r++) REQUIRE(std::isfinite(rowmax[r]));
  // Phase 2 on each shard, all-reduce SUM.
  Vec sumexp(N, 0.0f), tlogit(N, 0.0f);
  for (int k = 0; k < S; k++) {
    Vec se(N, 5.0f), tl(N, 5.0f);
    be().run(ops::k::XentShardSumexp(se.data(), tl.data(), shard_logits[k].data(), rowmax.data(), tgt.data(), N, Vl,
                           shard_real(k), k * Vl));
    for (int r = 0; r < N; r++) {
      const int local = tgt[r] - k * Vl;
      if (tgt[r] < 0 || local < 0 || local >= Vl) REQUIRE(tl[r] == 0.0f);  // target not in this shard
      if (shard_real(k) == 0) REQUIRE(se[r] == 0.0f);
      sumexp[r] += se[r];
      tlogit[r] += tl[r];
    }
  }
  // Phase 3 on each shard: the losses agree across shards; the probs concatenate.
  Vec probs(logits.size(), 7.0f);
  for (int k = 0; k < S; k++) {
    Vec l(N, 5.0f), p(shard_logits[k].size(), 7.0f);
    be().run(ops::k::XentShardFinish(l.data(), p.data(), shard_logits[k].data(), rowmax.data(), sumexp.data(), tlogit.data(),
                           tgt.data(), N, Vl, shard_real(k)));
    for (int r = 0; r < N; r++) {
      if (tgt[r] < 0) REQUIRE(l[r] == 0.0f);
      REQUIRE(l[r] == doctest::Approx(loss_full[r]).epsilon(1e-6));
    }
    // In place (probs aliasing logits), as the training loop runs it: the same result.
    Vec inplace = shard_logits[k], l2(N);
    be().run(ops::k::XentShardFinish(l2.data(), inplace.data(), inplace.data(), rowmax.data(), sumexp.data(), tlogit.data(),
                           tgt.data(), N, Vl, shard_real(k)));
    REQUIRE(inplace == p);
    REQUIRE(l2 == l);
    put_cols(probs, N, V, k * Vl, Vl, p);
  }
  for (size_t i = 0; i < probs.size(); i++) {
    if (probs_full[i] == 0.0f) REQUIRE(probs[i] == 0.0f);  // padding columns
    REQUIRE(std::fabs(probs[i] - probs_full[i]) <= 1e-6 * std::fabs(probs_full[i]) + 1e-30);
  }

  // Backward on each shard (overwriting, and in place on the probs): concatenated, it is the
  // full backward; bit for bit when fed the full kernel's own probabilities.
  Vec d(logits.size()), d_same(logits.size());
  for (int k = 0; k < S; k++) {
    Vec dk = cols(probs, N, V, k * Vl, Vl);
    be().run(ops::k::XentShardBackward(dk.data(), dk.data(), tgt.data(), dloss, N, Vl, shard_real(k), k * Vl));
    put_cols(d, N, V, k * Vl, Vl, dk);
    const Vec pk = cols(probs_full, N, V, k * Vl, Vl);
    Vec ds(pk.size(), 123.0f);
    be().run(ops::k::XentShardBackward(ds.data(), pk.data(), tgt.data(), dloss, N, Vl, shard_real(k), k * Vl));
    put_cols(d_same, N, V, k * Vl, Vl, ds);
  }
  REQUIRE(d_same == d_full);
  // At the target, d = (p - 1) dloss cancels: its error is on the scale of dloss, not of d.
  for (size_t i = 0; i < d.size(); i++) REQUIRE(std::fabs(d[i] - d_full[i]) <= 1e-6 * (std::fabs(d_full[i]) + dloss));
  for (int r = 0; r < N; r++)
    if (tgt[r] < 0)
      for (int i = 0; i < V; i++) REQUIRE(d[static_cast<size_t>(r) * V + i] == 0.0f);
}

// ============================================================================ attention
struct BlockRows {
  int saved;
  explicit BlockRows(int rows) : saved(ops::cpu::attention_block_rows()) { ops::cpu::set_attention_block_rows(rows); }
  ~BlockRows() { ops::cpu::set_attention_block_rows(saved); }
};

// The packed qkv (B,T,3*Cs) of heads [h0, h0 + nh) of a (B,T,3C) qkv.
Vec shard_qkv(const Vec& qkv, int B, int T, int C, int HS, int h0, int nh) {
  const int Cs = nh * HS;
  Vec out(static_cast<size_t>(B) * T * 3 * Cs);
  for (size_t bt = 0; bt < static_cast<size_t>(B) * T; bt++)
    for (int part = 0; part < 3; part++)
      std::copy_n(qkv.begin() + bt * 3 * C + part * C + h0 * HS, Cs, out.begin() + bt * 3 * Cs + part * Cs);
  return out;
}

}  // namespace

TEST_CASE("xent_shard: 2 and 3 vocabulary shards reproduce softmax_xent (padding, ignored row)") {
  check_xent_split({7, 10, 12, 2});  // shards of 6: [0,6) all real, [6,12) 4 real + 2 padding
  check_xent_split({7, 10, 12, 3});  // shards of 4: the last is 2 real + 2 padding
  check_xent_split({7, 8, 12, 3});   // the last shard is only padding (Vreal = 0)
  check_xent_split({5, 10, 12, 1});  // one shard is the unsharded kernel
  check_xent_split({16, 1000, 1032, 3});  // wider rows
}

TEST_CASE("xent_shard: a shard of only padding contributes -inf, 0, 0") {
  const int N = 3, V = 4;
  const Vec logits(N * V, 1e4f);
  const std::vector<int32_t> tgt = {0, 5, -1};
  Vec m(N, 1.0f), se(N, 1.0f), tl(N, 1.0f);
  be().run(ops::k::XentShardMax(m.data(), logits.data(), N, V, 0));
  for (float x : m) CHECK(x == -std::numeric_limits<float>::infinity());
  const Vec gmax = {0.5f, -2.0f, 3.0f};  // the group's maxima, after the all-reduce
  be().run(ops::k::XentShardSumexp(se.data(), tl.data(), logits.data(), gmax.data(), tgt.data(), N, V, 0, 8));
  for (int r = 0; r < N; r++) {
    CHECK(se[r] == 0.0f);
    CHECK(tl[r] == 0.0f);
  }
  Vec p(N * V, 7.0f);
  be().run(ops::k::XentShardBackward(p.data(), logits.data(), tgt.data(), 1.0f, N, V, 0, 8));
  for (float x : p) CHECK(x == 0.0f);
}

TEST_CASE("embedding_shard: the sum over vocabulary shards is the full embedding; dwte concatenates") {
  const int B = 3, T = 5, C = 24, Vreal = 10, V = 12, maxT = 7;
  const Vec wte = randn(static_cast<size_t>(V) * C, 41), wpe = randn(static_cast<size_t>(maxT) * C, 42);
  std::vector<int32_t> tok = randint(static_cast<size_t>(B) * T, 43, Vreal);
  tok[0] = 0;
  tok[1] = Vreal - 1;
  tok[2] = 5;
  tok[3] = 6;
  tok[4] = 5;  // a repeated token accumulates
  const size_t n = static_cast<size_t>(B) * T * C;
  const Vec dout = randn(n, 44);

  Vec full(n, 3.0f);
  be().run(ops::k::EmbeddingForward(full.data(), tok.data(), wte.data(), wpe.data(), B, T, C));
  Vec dwte_full(wte.size(), 0.5f), dwpe_full(wpe.size(), 0.25f);
  be().run(ops::k::EmbeddingBackward(dwte_full.data(), dwpe_full.data(), dout.data(), tok.data(), B, T, C));
  Vec nowpe(n);
  be().run(ops::k::EmbeddingForward(nowpe.data(), tok.data(), wte.data(), nullptr, B, T, C));

  for (int S : {2, 3}) {
    CAPTURE(S);
    const int Vl = V / S;
    Vec sum(n, 0.0f), sum_nowpe(n, 0.0f), dwte(wte.size());
    for (int k = 0; k < S; k++) {
      const float* wk = wte.data() + static_cast<size_t>(k) * Vl * C;
      Vec out(n, 3.0f);  // overwritten
      be().run(ops::k::EmbeddingShardForward(out.data(), tok.data(), wk, k == 0 ? wpe.data() : nullptr, B, T, C, k * Vl, Vl));
      for (size_t i = 0; i < n; i++) sum[i] += out[i];
      be().run(ops::k::EmbeddingShardForward(out.data(), tok.data(), wk, nullptr, B, T, C, k * Vl, Vl));
      for (size_t i = 0; i < n; i++) sum_nowpe[i] += out[i];

      Vec dw(static_cast<size_t>(Vl) * C, 0.5f), dp(wpe.size(), 0.25f);  // accumulated into
      be().run(ops::k::EmbeddingShardBackward(dw.data(), dp.data(), dout.data(), tok.data(), B, T, C, k * Vl, Vl));
      REQUIRE(dp == dwpe_full);  // every rank computes the whole dwpe (dout is replicated)
      std::copy(dw.begin(), dw.end(), dwte.begin() + static_cast<size_t>(k) * Vl * C);
      // Null gradients are skipped.
      Vec dw2(static_cast<size_t>(Vl) * C, 0.5f);
      be().run(ops::k::EmbeddingShardBackward(dw2.data(), nullptr, dout.data(), tok.data(), B, T, C, k * Vl, Vl));
      REQUIRE(dw2 == dw);
      be().run(ops::k::EmbeddingShardBackward(nullptr, nullptr, dout.data(), tok.data(), B, T, C, k * Vl, Vl));
    }
    REQUIRE(sum == full);
    REQUIRE(sum_nowpe == nowpe);
    REQUIRE(dwte == dwte_full);
  }
}

TEST_CASE("embedding: the unsharded kernel still matches wte[token] + wpe[t]") {
  const int B = 2, T = 4, C = 20, V = 9;
  const Vec wte = randn(static_cast<size_t>(V) * C, 51), wpe = randn(static_cast<size_t>(T) * C, 52);
  const std::vector<int32_t> tok = randint(static_cast<size_t>(B) * T, 53, V);
  Vec out(static_cast<size_t>(B) * T * C);
  be().run(ops::k::EmbeddingForward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C));
  for (int r = 0; r < B * T; r++)
    for (int i = 0; i < C; i++)
      REQUIRE(out[static_cast<size_t>(r) * C + i] ==
              wte[static_cast<size_t>(tok[r]) * C + i] + wpe[static_cast<size_t>(r % T) * C + i]);
}

TEST_CASE("attention: head shards (heads_total, head_start) reproduce the full model bit for bit, dropout included") {
  const int B = 2, T = 37, NH = 4, HS = 8, C = NH * HS, nh = 2, Cs = nh * HS;
  BlockRows rows(16);  // T = 37 crosses block edges and is not a multiple of 16
  const Vec qkv = randn(static_cast<size_t>(B) * T * 3 * C, 61);
  const Vec dout = randn(static_cast<size_t>(B) * T * C, 62);
  const uint64_t key = ops::rng_key(7, 8);
  for (uint64_t offset : {uint64_t{0}, uint64_t{3} * NH * T * T}) {
    CAPTURE(offset);
    ops::DropoutSpec drop{0.3f, key, offset};
    Vec out(static_cast<size_t>(B) * T * C), probs(static_cast<size_t>(B) * NH * T);  // the lse
    Vec dqkv(qkv.size(), 0.0f);
    be().run(ops::k::AttentionForward(out.data(), probs.data(), qkv.data(), B, T, C, NH, drop));
    be().run(ops::k::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), probs.data(), B, T, C, NH, drop));

    // heads_total = 0 is heads_total = NH, head_start = 0.
    {
      ops::DropoutSpec d2 = drop;
      d2.heads_total = NH;
      Vec out2(out.size()), probs2(probs.size()), dqkv2(qkv.size(), 0.0f);
      be().run(ops::k::AttentionForward(out2.data(), probs2.data(), qkv.data(), B, T, C, NH, d2));
      be().run(ops::k::AttentionBackward(dqkv2.data(), dout.data(), qkv.data(), probs2.data(), B, T, C, NH, d2));
      REQUIRE(out2 == out);
      REQUIRE(probs2 == probs);
      REQUIRE(dqkv2 == dqkv);
    }

    // Two shards of two heads each, scattered back into the full layout.
    Vec out_s(out.size(), -1.0f), probs_s(probs.size(), -1.0f), dqkv_s(qkv.size(), -1.0f);
    for (int h0 : {0, 2}) {
      ops::DropoutSpec ds = drop;
      ds.heads_total = NH;
      ds.head_start = h0;
      const Vec q = shard_qkv(qkv, B, T, C, HS, h0, nh);
      Vec dO(static_cast<size_t>(B) * T * Cs);
      for (size_t bt = 0; bt < static_cast<size_t>(B) * T; bt++)
        std::copy_n(dout.begin() + bt * C + h0 * HS, Cs, dO.begin() + bt * Cs);
      Vec o(dO.size()), p(static_cast<size_t>(B) * nh * T), dq(q.size(), 0.0f);
      be().run(ops::k::AttentionForward(o.data(), p.data(), q.data(), B, T, Cs, nh, ds));
      be().run(ops::k::AttentionBackward(dq.data(), dO.data(), q.data(), p.data(), B, T, Cs, nh, ds));
      for (size_t bt = 0; bt < static_cast<size_t>(B) * T; bt++) {
        std::copy_n(o.begin() + bt * Cs, Cs, out_s.begin() + bt * C + h0 * HS);
        for (int part = 0; part < 3; part++)
          std::copy_n(dq.begin() + bt * 3 * Cs + part * Cs, Cs, dqkv_s.begin() + bt * 3 * C + part * C + h0 * HS);
      }
      for (int b = 0; b < B; b++)
        std::copy_n(p.begin() + static_cast<size_t>(b) * nh * T, static_cast<size_t>(nh) * T,
                    probs_s.begin() + (static_cast<size_t>(b) * NH + h0) * T);
    }
    REQUIRE(out_s == out);
    REQUIRE(probs_s == probs);
    REQUIRE(dqkv_s == dqkv);

    // A shard that ignored heads_total would draw another mask: the test can tell.
    {
      ops::DropoutSpec wrong = drop;  // heads_total = 0: counters of a 2-head model
      const Vec q = shard_qkv(qkv, B, T, C, HS, 2, nh);
      Vec o(static_cast<size_t>(B) * T * Cs), p(static_cast<size_t>(B) * nh * T);
      be().run(ops::k::AttentionForward(o.data(), p.data(), q.data(), B, T, Cs, nh, wrong));
      bool differs = false;
      for (size_t bt = 0; bt < static_cast<size_t>(B) * T && !differs; bt++)
        for (int i = 0; i < Cs; i++) differs |= o[bt * Cs + i] != out[bt * C + 2 * HS + i];
      CHECK(differs);
    }
  }
}
