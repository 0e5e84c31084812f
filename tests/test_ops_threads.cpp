// Thread-count independence of the CPU kernels: every kernel that reduces over
// rows or elements (norm weight/bias gradients, matmul dbias and dweight, embedding backward,
// attention backward, the loss, sum_squares, AdamW, dropout, the 16-bit GEMMs) gives the same
// bytes at 1, 2 and 3 threads. Shapes are large enough to take each kernel's parallel path.
// The end-to-end check (training at 1/2/3 threads, checkpoints bit for bit) is
// tests/test_train_threads.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "tests/gradcheck.h"

using gc::Vec;

namespace {

// Runs `f` (`what`: which kernel, for the report; f fills and returns its outputs) at 1, 2 and 3 threads; the bytes must match.
void same_at_thread_counts(const std::string& what, const std::function<Vec()>& f) {
  CAPTURE(what);
  const int before = ops::num_threads();
  ops::set_num_threads(1);
  const Vec ref = f();
  for (int t : {2, 3}) {
    CAPTURE(t);
    ops::set_num_threads(t);
    const Vec got = f();
    REQUIRE(got.size() == ref.size());
    size_t differ = 0;
    for (size_t i = 0; i < ref.size(); i++) differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    CHECK(differ == 0);
  }
  ops::set_num_threads(before);
}

Vec cat(std::initializer_list<const Vec*> parts) {
  Vec out;
  for (const Vec* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

constexpr int N = 2048, C = 192;  // 2048 rows: a quickstart micro-batch (32 x 64)

}  // namespace

TEST_CASE("norm backward: weight and bias gradients do not depend on the thread count") {
  const Vec x = gc::randn(size_t(N) * C, 1), dout = gc::randn(size_t(N) * C, 2), w = gc::randn(C, 3);
  Vec out(x.size()), mean(N), rstd(N);
  gc::be().run(ops::k::LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C, 1e-5f));
  same_at_thread_counts("layernorm backward", [&] {
    Vec dx(x.size()), dw(C, 0.5f), db(C, 0.25f);
    gc::be().run(ops::k::LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                rstd.data(), N, C));
    return cat({&dx, &dw, &db});
  });
  gc::be().run(ops::k::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f));
  same_at_thread_counts("rmsnorm backward", [&] {
    Vec dx(x.size()), dw(C, 0.5f);
    gc::be().run(ops::k::RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C));
    return cat({&dx, &dw});
  });
}

TEST_CASE("matmul backward (fp32 sgemm and the 16-bit GEMMs): dweight and dbias do not depend on the thread count") {
  // (C, OC): the quickstart's and a GPT-2-ish block's shapes, an odd OC, a vocabulary-sized OC
  // (the 16-bit dweight's 12 or more row tiles), and weights wide enough that the 16-bit dweight
  // tiles their columns too (C 384 and 400: 2 and 3 column groups, odd last tiles); small C * OC
  // against a long K = N is where a GEMM library splits K across threads.
  for (auto [C, OC] : {std::pair{128, 128}, std::pair{128, 512}, std::pair{192, 576}, std::pair{192, 773},
                       std::pair{64, 5003}, std::pair{384, 1100}, std::pair{400, 300}}) {
    CAPTURE(C);
    CAPTURE(OC);
    Vec x = gc::randn(size_t(N) * C, 4), dout = gc::randn(size_t(N) * OC, 5), w = gc::randn(size_t(OC) * C, 6);
    // A few subnormal operands and tiny products: GEMM kernels differ in how they flush them,
    // so a split that sends a row to another kernel (a tail) shows up here.
    for (size_t i = 0; i < x.size(); i += 97) x[i] = 3e-39f;
    for (size_t i = 0; i < dout.size(); i += 89) dout[i] = 1e-20f;
    const Vec bias = gc::randn(size_t(OC), 7);
    same_at_thread_counts("fp32 matmul forward", [&] {
      Vec out(size_t(N) * OC);
      gc::be().run(ops::k::MatmulForward(out.data(), x.data(), w.data(), bias.data(), N, C, OC));
      return out;
    });
    same_at_thread_counts("fp32 matmul dinp", [&] {
      Vec dx(x.size(), 0.5f);
      gc::be().run(ops::k::MatmulBackward(dx.data(), nullptr, nullptr, dout.data(), x.data(), w.data(), N, C, OC));
      return dx;
    });
    same_at_thread_counts("fp32 matmul dweight and dbias", [&] {
      Vec dw(w.size(), 0.25f), db(OC, 0.125f);
      gc::be().run(ops::k::MatmulBackward(nullptr, dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC));
      return cat({&dw, &db});
    });
    for (ops::DType t : {ops::DType::BF16, ops::DType::F16}) {
      if (!gc::be().has(ops::Kernel::MatmulForward, t)) continue;
      CAPTURE(ops::dtype_name(t));
      std::vector<uint16_t> x16(x.size()), d16(dout.size()), w16(w.size());
      gc::be().run(ops::k::Convert(x16.data(), t, x.data(), ops::DType::F32, int64_t(x.size())));
      gc::be().run(ops::k::Convert(d16.data(), t, dout.data(), ops::DType::F32, int64_t(dout.size())));
      gc::be().run(ops::k::Convert(w16.data(), t, w.data(), ops::DType::F32, int64_t(w.size())));
      same_at_thread_counts("16-bit matmul forward", [&] {
        Vec out(size_t(N) * OC);
        gc::be().run(ops::k::MatmulForward(out.data(), x16.data(), w16.data(), nullptr, N, C, OC), t);
        return out;
      });
      same_at_thread_counts("16-bit matmul dinp", [&] {
        Vec dx(x.size(), 0.5f);
        gc::be().run(ops::k::MatmulBackward(dx.data(), nullptr, nullptr, d16.data(), x16.data(), w16.data(), N, C, OC), t);
        return dx;
      });
      same_at_thread_counts("16-bit matmul dweight and dbias", [&] {
        Vec dw(w.size(), 0.25f), db(OC, 0.125f);
        gc::be().run(ops::k::MatmulBackward(nullptr, dw.data(), db.data(), d16.data(), x16.data(), w16.data(), N, C, OC), t);
        return cat({&dw, &db});
      });
    }
  }
}

TEST_CASE("embedding, loss, attention, dropout: gradients do not depend on the thread count") {
  const int B = 32, T = 64, V = 256, NH = 16;
  const auto tokens = gc::randint(size_t(B) * T, 7, V - 3);  // the loss's real vocabulary: V - 3
  const Vec dout = gc::randn(size_t(B) * T * C, 8);
  same_at_thread_counts("embedding backward", [&] {
    Vec dwte(size_t(V) * C, 0.5f), dwpe(size_t(T) * C, 0.25f);
    gc::be().run(ops::k::EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C));
    return cat({&dwte, &dwpe});
  });
  const Vec logits = gc::randn(size_t(B) * T * V, 9, 3.0f);
  same_at_thread_counts("softmax cross-entropy", [&] {
    Vec losses(size_t(B) * T), probs(logits.size()), dl(logits.size());
    gc::be().run(ops::k::SoftmaxXentForward(losses.data(), probs.data(), logits.data(), tokens.data(), B * T, V, V - 3));
    gc::be().run(ops::k::SoftmaxXentBackward(dl.data(), probs.data(), tokens.data(), 1.0f / (B * T), B * T, V, V - 3));
    return cat({&losses, &dl});
  });
  const int Bq = 8;
  const Vec qkv = gc::randn(size_t(Bq) * T * 3 * C, 10), ao = gc::randn(size_t(Bq) * T * C, 11);
  for (float p : {0.0f, 0.1f}) {
    const ops::DropoutSpec drop{p, 1234, 77};
    same_at_thread_counts("attention and dropout", [&] {
      Vec out(size_t(Bq) * T * C), lse(size_t(Bq) * NH * T), dqkv(qkv.size(), 0.5f);
      gc::be().run(ops::k::AttentionForward(out.data(), lse.data(), qkv.data(), Bq, T, C, ops::Heads(NH), drop));
      gc::be().run(ops::k::AttentionBackward(dqkv.data(), ao.data(), qkv.data(), lse.data(), Bq, T, C, ops::Heads(NH), drop,
                                  nullptr));
      Vec dr(ao.size()), dd(ao.size(), 0.5f);
      gc::be().run(ops::k::DropoutForward(dr.data(), ao.data(), int64_t(ao.size()), drop));
      gc::be().run(ops::k::DropoutBackward(dd.data(), ao.data(), int64_t(ao.size()), drop));
      return cat({&out, &lse, &dqkv, &dr, &dd});
    });
  }
}

TEST_CASE("sum_squares and AdamW do not depend on the thread count") {
  for (int64_t n : {int64_t(1), int64_t(100003), int64_t(1) << 20}) {
    CAPTURE(n);
    const Vec g = gc::randn(size_t(n), 12), p0 = gc::randn(size_t(n), 13);
    same_at_thread_counts("sum_squares and AdamW", [&] {
      const double ss = ops::sum_squares(gc::be(), g.data(), n);
      Vec p = p0, m(size_t(n), 0.01f), v(size_t(n), 0.02f);
      gc::be().run(ops::k::AdamwUpdate(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f));
      Vec s(2);
      std::memcpy(s.data(), &ss, sizeof ss);
      return cat({&s, &p, &m, &v});
    });
  }
}
