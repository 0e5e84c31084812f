// Linear operators (matmul with optional bias, token + position embedding) of the CPU
// backend against double references, driven by tables of cases (see gradcheck.h).
#include "tests/gradcheck.h"

using namespace gc;

namespace {

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias
DVec ref_matmul(const DVec& inp, const DVec& w, const DVec* bias, int N, int C, int OC) {
  DVec out(static_cast<size_t>(N) * OC);
  for (int r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int i = 0; i < C; i++) s += inp[static_cast<size_t>(r) * C + i] * w[static_cast<size_t>(o) * C + i];
      out[static_cast<size_t>(r) * OC + o] = s;
    }
  return out;
}

struct MatmulShape {
  int N, C, OC;
  bool bias = true;
};
// Odd sizes (N=1, C=1, primes), GPT-like widths, and a GEMM big enough for OpenBLAS to thread.
const MatmulShape kMatmul[] = {{1, 1, 1},    {1, 5, 3},   {3, 17, 29},  {8, 64, 192, false}, {31, 48, 33},
                               {16, 384, 96}, {128, 96, 160}, {7, 13, 50, false}};

OpCase matmul_case(const MatmulShape& s) {
  const int N = s.N, C = s.C, OC = s.OC;
  const bool hb = s.bias;
  const uint64_t seed = static_cast<uint64_t>(N) * 7919 + C * 31 + OC;
  OpCase c;
  c.name = "matmul N=" + std::to_string(N) + " C=" + std::to_string(C) + " OC=" + std::to_string(OC) +
           (hb ? "" : " no-bias");
  c.inputs = {{"inp", randn(static_cast<size_t>(N) * C, seed)},
              {"weight", randn(static_cast<size_t>(OC) * C, seed + 1, 0.2f)},
              {"bias", randn(OC, seed + 2), hb}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_matmul(a[0], a[1], hb ? &a[2] : nullptr, N, C, OC); };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out(static_cast<size_t>(N) * OC, 123.0f);  // garbage: forward must overwrite
    be().run(ops::k::MatmulForward(out.data(), a[0].data(), a[1].data(), hb ? a[2].data() : nullptr, N, C, OC));
    return out;
  };
  c.backward = [=](const std::vector<Vec>& a, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::MatmulBackward(g[0], g[1], g[2], dout.data(), a[0].data(), a[1].data(), N, C, OC));
  };
  // The double reference is O(N C OC) per FD evaluation; check a subset on the big shapes.
  c.max_coords = 120;
  return c;
}

// out (B,T,C) = wte[tokens] + wpe[t]
DVec ref_embedding(const std::vector<int32_t>& tok, const DVec& wte, const DVec* wpe, int B, int T, int C) {
  DVec out(static_cast<size_t>(B) * T * C);
  for (int r = 0; r < B * T; r++)
    for (int i = 0; i < C; i++)
      out[static_cast<size_t>(r) * C + i] =
          wte[static_cast<size_t>(tok[r]) * C + i] + (wpe ? (*wpe)[static_cast<size_t>(r % T) * C + i] : 0.0);
  return out;
}

struct EmbShape {
  int B, T, C, V, maxT;
  bool pos = true;
};
// Small vocabularies make tokens repeat, which is what the backward's scatter-add must get right.
const EmbShape kEmb[] = {{1, 1, 1, 1, 1}, {2, 5, 7, 3, 8}, {3, 16, 48, 10, 16, false}, {8, 64, 96, 50, 80},
                         {4, 33, 20, 1000, 40}};

OpCase embedding_case(const EmbShape& s) {
  const int B = s.B, T = s.T, C = s.C, V = s.V, maxT = s.maxT;
  const bool hp = s.pos;
  const uint64_t seed = static_cast<uint64_t>(B) * 101 + T * 13 + C + V;
  const std::vector<int32_t> tok = randint(static_cast<size_t>(B) * T, seed, V);
  OpCase c;
  c.name = "embedding B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
           " V=" + std::to_string(V) + (hp ? "" : " no-wpe");
  c.inputs = {{"wte", randn(static_cast<size_t>(V) * C, seed)}, {"wpe", randn(static_cast<size_t>(maxT) * C, seed + 1), hp}};
  c.ref_forward = [=](const std::vector<DVec>& a) { return ref_embedding(tok, a[0], hp ? &a[1] : nullptr, B, T, C); };
  c.forward = [=](const std::vector<Vec>& a) {
    Vec out(static_cast<size_t>(B) * T * C, -7.0f);
    be().run(ops::k::EmbeddingForward(out.data(), tok.data(), a[0].data(), hp ? a[1].data() : nullptr, B, T, C));
    return out;
  };
  c.backward = [=](const std::vector<Vec>&, const Vec& dout, const std::vector<float*>& g) {
    be().run(ops::k::EmbeddingBackward(g[0], g[1], dout.data(), tok.data(), B, T, C));
  };
  return c;
}

}  // namespace

TEST_CASE("matmul: forward and backward against double reference") {
  for (const MatmulShape& s : kMatmul) run_case(matmul_case(s));
}

TEST_CASE("embedding: forward and backward against double reference") {
  for (const EmbShape& s : kEmb) run_case(embedding_case(s));
}

TEST_CASE("matmul: GPT-sized shapes agree with the double reference (forward and weight gradient)") {
  // Too large for finite differences; checks that the multi-threaded GEMM and the parallel
  // bias reduction are wired right at the real sizes, against the analytic double gradients.
  const int N = 256, C = 384, OC = 1152;
  const Vec inp = randn(static_cast<size_t>(N) * C, 1), w = randn(static_cast<size_t>(OC) * C, 2, 0.05f),
            b = randn(OC, 3), dout = randn(static_cast<size_t>(N) * OC, 4);
  Vec out(static_cast<size_t>(N) * OC);
  be().run(ops::k::MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, C, OC));
  const DVec db = to_double(b);
  CHECK(rel_err(out, ref_matmul(to_double(inp), to_double(w), &db, N, C, OC)) < 1e-5);

  Vec dinp(inp.size(), 0.0f), dw(w.size(), 0.0f), dbias(OC, 0.0f);
  be().run(ops::k::MatmulBackward(dinp.data(), dw.data(), dbias.data(), dout.data(), inp.data(), w.data(), N, C, OC));
  DVec rdinp(inp.size(), 0.0), rdw(w.size(), 0.0), rdb(OC, 0.0);
  for (int r = 0; r < N; r++)
    for (int o = 0; o < OC; o++) {
      const double d = dout[static_cast<size_t>(r) * OC + o];
      rdb[o] += d;
      for (int i = 0; i < C; i++) {
        rdinp[static_cast<size_t>(r) * C + i] += d * w[static_cast<size_t>(o) * C + i];
        rdw[static_cast<size_t>(o) * C + i] += d * inp[static_cast<size_t>(r) * C + i];
      }
    }
  CHECK(rel_err(dinp, rdinp) < 1e-5);
  CHECK(rel_err(dw, rdw) < 1e-5);
  CHECK(rel_err(dbias, rdb) < 1e-5);
}
