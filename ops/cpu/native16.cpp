// 16-bit-native memory-bound kernels: tiles widened into thread-local fp32
// buffers, the backend's fp32 kernel on each tile, results rounded back (see native16.h).
#include "ops/cpu/native16.h"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/check.h"
#include "ops/cpu/tile_convert.h"
#include "ops/cpu/vecmath.h"
#include "ops/rng.h"

namespace ops::native16 {
namespace {

// Elements per tile of a pointwise operator (32 KiB of fp32 per buffer: a few buffers stay
// in L2 while the fp32 kernel runs on them), and the rows of a row operator's tile.
constexpr int64_t kTile = 1 << 13;
int64_t tile_rows(int64_t width) { return std::max<int64_t>(1, kTile / std::max<int64_t>(width, 1)); }

// Thread-local fp32 tile buffer number k (of 3), at least n floats; zeroed when asked.
float* buf(int k, int64_t n, bool zero = false) {
  thread_local std::vector<float> b[3];
  if (static_cast<int64_t>(b[k].size()) < n) b[k].resize(static_cast<size_t>(n));
  if (zero) std::fill(b[k].begin(), b[k].begin() + n, 0.0f);
  return b[k].data();
}
const uint16_t* at(const void* p, int64_t i) { return static_cast<const uint16_t*>(p) + i; }
uint16_t* at(void* p, int64_t i) { return static_cast<uint16_t*>(p) + i; }

// A tile's conversions: ops/cpu/tile_convert.h (no OpenMP region of their own).
using cpu::tile_to_f32;
using cpu::tile_from_f32;

// Elements [off, off + n) of a 16-bit tensor, widened into a tile buffer.
float* widen(int k, const void* src, DType t, int64_t off, int64_t n) {
  float* b = buf(k, n);
  tile_to_f32(b, at(src, off), t, n);
  return b;
}
void round_out(void* dst, DType t, int64_t off, const float* src, int64_t n) { tile_from_f32(at(dst, off), src, t, n); }
// dst[off, off + n) := RNE(dst + g): the Accumulate kernel's fold, one tile (g accumulated into
// a zeroed tile buffer, as on the widened path).
void fold(void* dst, DType t, int64_t off, const float* g, int64_t n) { cpu::tile_fold(at(dst, off), g, t, n); }

// f(first, count) on the tiles of [0, n), shared out over the OpenMP team.
template <class F>
void tiles(int64_t n, int64_t tile, F&& f) {
  cpu::parallel_blocks(n, tile, [&](int64_t b, int64_t e, int) { f(b, e - b); });
}

}  // namespace

// ---------------------------------------------------------------------------- bf16 in registers
// bf16's pointwise kernels convert in registers: each element is widened (a shift), the fp32
// kernel's own formula (vecmath.h, cpu_backend.cpp's *_range loops) applied, and the result
// rounded (ops/convert.h's integer rule) in the same vector loop, with no tile buffer between
// (a tile pass reads and writes each element three more times, in L1). A gradient is folded
// as the tile path folds it: RNE(d + (0 + g)), the `0 +` being the zeroed tile's, so -0.0
// contributions come out as they do there. The bits are the tile path's (test_ops_native16).
// fp16 keeps the tiles: its vector conversion (VCVTPH2PS/VCVTPS2PH on 16-element groups, the
// scalar rule on a tail) is what ops/convert.h defines, and the tile path is that.
namespace {
OPS_INLINE float ld(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
OPS_INLINE void st(void* p, int64_t i, float x) { static_cast<uint16_t*>(p)[i] = f32_to_bf16(x); }
OPS_INLINE void fold_st(void* p, int64_t i, float g) { st(p, i, ld(p, i) + (0.0f + g)); }
void check_p(const DropoutSpec& drop) {  // the fp32 kernel's check, which the tile path reaches
  OPS_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "dropout: p must be in [0, 1), got " + std::to_string(drop.p));
}
}  // namespace

// The activations (OPS_ACTIVATIONS, ops/kernels.h): bf16 in registers through the formula,
// fp16 through the fp32 kernel on widened tiles.
namespace {
template <class Fwd, class F>
void activation_forward(Backend& be, void* out, const void* inp, DType t, int64_t n, F f) {
  if (t == DType::BF16)
    return tiles(n, kTile, [&](int64_t i0, int64_t m) {
#pragma omp simd
      for (int64_t i = i0; i < i0 + m; ++i) st(out, i, f(ld(inp, i)));
    });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* y = buf(1, m);
    be.run(Fwd{y, widen(0, inp, t, i0, m), m});
    round_out(out, t, i0, y, m);
  });
}
template <class Bwd, class DF>
void activation_backward(Backend& be, void* dinp, const void* inp, const void* dout, DType t, int64_t n, DF df) {
  if (!dinp) return;
  if (t == DType::BF16)
    return tiles(n, kTile, [&](int64_t i0, int64_t m) {
#pragma omp simd
      for (int64_t i = i0; i < i0 + m; ++i) fold_st(dinp, i, ld(dout, i) * df(ld(inp, i)));
    });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* g = buf(2, m, true);
    be.run(Bwd{g, widen(0, inp, t, i0, m), widen(1, dout, t, i0, m), m});
    fold(dinp, t, i0, g, m);
  });
}
}  // namespace

#define OPS_NATIVE16_ACTIVATION(A, a)                                                                    \
  void a##_forward(Backend& be, void* out, const void* inp, DType t, int64_t n) {                       \
    activation_forward<k::A##Forward>(be, out, inp, t, n, [](float x) { return cpu::a##_f(x); });       \
  }                                                                                                      \
  void a##_backward(Backend& be, void* dinp, const void* inp, const void* dout, DType t, int64_t n) {   \
    activation_backward<k::A##Backward>(be, dinp, inp, dout, t, n, [](float x) { return cpu::a##_grad_f(x); }); \
  }
OPS_ACTIVATIONS(OPS_NATIVE16_ACTIVATION)
#undef OPS_NATIVE16_ACTIVATION

void add_forward(Backend& be, void* out, const void* a, const void* b, DType t, int64_t n) {
  if (t == DType::BF16)
    return tiles(n, kTile, [&](int64_t i0, int64_t m) {
#pragma omp simd
      for (int64_t i = i0; i < i0 + m; ++i) st(out, i, ld(a, i) + ld(b, i));
    });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* y = buf(2, m);
    be.run(k::AddForward(y, widen(0, a, t, i0, m), widen(1, b, t, i0, m), m));
    round_out(out, t, i0, y, m);
  });
}
void add_inplace(Backend& be, void* dst, const void* src, DType t, int64_t n) {
  if (!dst) return;
  if (t == DType::BF16)
    return tiles(n, kTile, [&](int64_t i0, int64_t m) {
#pragma omp simd
      for (int64_t i = i0; i < i0 + m; ++i) fold_st(dst, i, ld(src, i));
    });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* g = buf(2, m, true);
    be.run(k::AddInplace(g, widen(0, src, t, i0, m), m));
    fold(dst, t, i0, g, m);
  });
}

// A tile's mask counters continue from the whole tensor's: element i0 + k has counter
// offset + i0 + k, as in the untiled kernel.
DropoutSpec tile_drop(DropoutSpec d, int64_t i0) {
  d.offset += static_cast<uint64_t>(i0);
  return d;
}
// bf16: the fp32 kernel's rule, element i keeps iff rng_uniform(key, offset + i) >= p (its
// p <= 0 case a copy, which the round trip below reproduces bit for bit, NaNs quietened).
// bf16's dropout in one vector loop over SRC, forward and backward: EMIT(i, v) stores (forward)
// or folds (backward) element i's v = SRC[i] * scale where its mask keeps it, else 0 (p <= 0:
// SRC[i] itself).
template <class Emit>
void dropout_bf16(const void* src, int64_t n, DropoutSpec drop, Emit emit) {
  check_p(drop);
  const float p = drop.p, scale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    if (p <= 0.0f) {
#pragma omp simd
      for (int64_t i = i0; i < i0 + m; ++i) emit(i, ld(src, i));
      return;
    }
#pragma omp simd
    for (int64_t i = i0; i < i0 + m; ++i) {  // the load unconditional: a masked 16-bit load does not vectorize
      const float x = ld(src, i) * scale;
      emit(i, rng_uniform(drop.key, drop.offset + static_cast<uint64_t>(i)) >= p ? x : 0.0f);
    }
  });
}
void dropout_forward(Backend& be, void* out, const void* inp, DType t, int64_t n, DropoutSpec drop) {
  if (t == DType::BF16) return dropout_bf16(inp, n, drop, [out](int64_t i, float v) { st(out, i, v); });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* y = buf(1, m);
    be.run(k::DropoutForward(y, widen(0, inp, t, i0, m), m, tile_drop(drop, i0)));
    round_out(out, t, i0, y, m);
  });
}
void dropout_backward(Backend& be, void* dinp, const void* dout, DType t, int64_t n, DropoutSpec drop) {
  if (!dinp) return;
  if (t == DType::BF16) return dropout_bf16(dout, n, drop, [dinp](int64_t i, float v) { fold_st(dinp, i, v); });
  tiles(n, kTile, [&](int64_t i0, int64_t m) {
    float* g = buf(2, m, true);
    be.run(k::DropoutBackward(g, widen(0, dout, t, i0, m), m, tile_drop(drop, i0)));
    fold(dinp, t, i0, g, m);
  });
}

void swiglu_forward(Backend& be, void* out, const void* inp, DType t, int N, int H) {
  const int64_t W = 2 * static_cast<int64_t>(H);
  tiles(N, tile_rows(W), [&](int64_t r0, int64_t rows) {
    float* y = buf(1, rows * H);
    be.run(k::SwigluForward(y, widen(0, inp, t, r0 * W, rows * W), static_cast<int>(rows), H));
    round_out(out, t, r0 * H, y, rows * H);
  });
}
void swiglu_backward(Backend& be, void* dinp, const void* dout, const void* inp, DType t, int N, int H) {
  if (!dinp) return;
  const int64_t W = 2 * static_cast<int64_t>(H);
  tiles(N, tile_rows(W), [&](int64_t r0, int64_t rows) {
    float* g = buf(2, rows * W, true);
    be.run(k::SwigluBackward(g, widen(1, dout, t, r0 * H, rows * H), widen(0, inp, t, r0 * W, rows * W),
                       static_cast<int>(rows), H));
    fold(dinp, t, r0 * W, g, rows * W);
  });
}

void layernorm_forward(Backend& be, void* out, float* mean, float* rstd, const void* inp, const float* weight,
                       const float* bias, DType t, int N, int C, float eps) {
  tiles(N, tile_rows(C), [&](int64_t r0, int64_t rows) {
    float* y = buf(1, rows * C);
    be.run(k::LayerNormForward(y, mean ? mean + r0 : nullptr, rstd ? rstd + r0 : nullptr,
                         widen(0, inp, t, r0 * C, rows * C), weight, bias, static_cast<int>(rows), C, eps));
    round_out(out, t, r0 * C, y, rows * C);
  });
}
void rmsnorm_forward(Backend& be, void* out, float* rstd, const void* inp, const float* weight, DType t, int N,
                     int C, float eps) {
  tiles(N, tile_rows(C), [&](int64_t r0, int64_t rows) {
    float* y = buf(1, rows * C);
    be.run(k::RmsNormForward(y, rstd ? rstd + r0 : nullptr, widen(0, inp, t, r0 * C, rows * C), weight,
                       static_cast<int>(rows), C, eps));
    round_out(out, t, r0 * C, y, rows * C);
  });
}

namespace {
// A norm's backward over the fp32 kernel's own row blocks: `block_call(r0, rows, g, slot)` runs
// the fp32 backward on one block (g: its zeroed dinp tile or null; slot: its zeroed partial
// [dweight | dbias], `width` floats), then g is folded into dinp; the partials are added into
// dweight (and dbias) in block order, as the fp32 kernel's Partials::fold adds them.
// `after(r0, rows)` runs on the block once g is folded (AddNorm adds the block's
// total d(sum) into d(a) and d(b) there, while it is in cache).
template <class F, class A>
void norm_backward_blocks(void* dinp, float* dweight, float* dbias, DType t, int N, int C, F&& block_call, A&& after) {
  const int64_t block = cpu::norm_reduce_block_rows(C);
  const int64_t nb = cpu::num_blocks(N, block), width = 2 * static_cast<int64_t>(C);
  std::vector<float> part(static_cast<size_t>(nb * width), 0.0f);
  float* pp = part.data();
  cpu::parallel_blocks(N, block, [&](int64_t r0, int64_t r1, int blk) {
    const int64_t rows = r1 - r0;
    float* g = dinp ? buf(2, rows * C, true) : nullptr;
    block_call(r0, rows, g, pp + blk * width);
    if (g) fold(dinp, t, r0 * C, g, rows * C);
    after(r0, rows);
  });
  for (int k = 0; k < 2; ++k) {
    float* dst = k == 0 ? dweight : dbias;
    if (!dst) continue;
    cpu::parallel_chunks(C, 256, [&](int64_t c0, int64_t c1) {
      for (int64_t i = 0; i < nb; ++i) {
        const float* s = pp + i * width + k * C;
        for (int64_t j = c0; j < c1; ++j) dst[j] += s[j];
      }
    });
  }
}
template <class F>
void norm_backward_blocks(void* dinp, float* dweight, float* dbias, DType t, int N, int C, F&& block_call) {
  norm_backward_blocks(dinp, dweight, dbias, t, N, C, block_call, [](int64_t, int64_t) {});
}

// AddNorm's forward per tile of rows: add_forward's tile (widen a and b, the fp32
// add, round into sum), then the norm's tile over the stored sum widened back, as the unfused
// norm reads it: the same buffers and calls as the two unfused kernels, one pass over the rows.
template <class F>
void add_norm_forward_tiles(Backend& be, void* sum, void* out, const void* a, const void* b, DType t, int N, int C,
                            F&& norm_call) {
  tiles(N, tile_rows(C), [&](int64_t r0, int64_t rows) {
    const int64_t off = r0 * C, n = rows * C;
    float* s = buf(2, n);
    be.run(k::AddForward(s, widen(0, a, t, off, n), widen(1, b, t, off, n), n));
    round_out(sum, t, off, s, n);
    float* y = buf(1, n);
    norm_call(y, widen(0, sum, t, off, n), r0, rows);
    round_out(out, t, off, y, n);
  });
}
// The backward's second half on one block, once its norm gradient is folded into
// dsum: add_inplace's tile (0 + dsum into a zeroed buffer, folded) into da and db.
auto add_total(Backend& be, void* da, void* db, const void* dsum, DType t, int C) {
  return [&be, da, db, dsum, t, C](int64_t r0, int64_t rows) {
    const int64_t off = r0 * C, n = rows * C;
    for (void* d : {da, db}) {
      if (!d) continue;
      float* g = buf(2, n, true);
      be.run(k::AddInplace(g, widen(0, dsum, t, off, n), n));
      fold(d, t, off, g, n);
    }
  };
}
}  // namespace

void layernorm_backward(Backend& be, void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                        const float* weight, const float* mean, const float* rstd, DType t, int N, int C) {
  if (!dinp && !dweight && !dbias) return;
  norm_backward_blocks(dinp, dweight, dbias, t, N, C, [&](int64_t r0, int64_t rows, float* g, float* slot) {
    be.run(k::LayerNormBackward(g, dweight ? slot : nullptr, dbias ? slot + C : nullptr,
                          widen(1, dout, t, r0 * C, rows * C), widen(0, inp, t, r0 * C, rows * C), weight,
                          mean + r0, rstd + r0, static_cast<int>(rows), C));
  });
}
void rmsnorm_backward(Backend& be, void* dinp, float* dweight, const void* dout, const void* inp,
                      const float* weight, const float* rstd, DType t, int N, int C) {
  if (!dinp && !dweight) return;
  norm_backward_blocks(dinp, dweight, nullptr, t, N, C, [&](int64_t r0, int64_t rows, float* g, float* slot) {
    be.run(k::RmsNormBackward(g, dweight ? slot : nullptr, widen(1, dout, t, r0 * C, rows * C),
                        widen(0, inp, t, r0 * C, rows * C), weight, rstd + r0, static_cast<int>(rows), C));
  });
}

void add_layernorm_forward(Backend& be, void* sum, void* out, float* mean, float* rstd, const void* a, const void* b,
                           const float* weight, const float* bias, DType t, int N, int C, float eps) {
  add_norm_forward_tiles(be, sum, out, a, b, t, N, C, [&](float* y, const float* x, int64_t r0, int64_t rows) {
    be.run(k::LayerNormForward(y, mean ? mean + r0 : nullptr, rstd ? rstd + r0 : nullptr, x, weight, bias,
                         static_cast<int>(rows), C, eps));
  });
}
void add_layernorm_backward(Backend& be, void* da, void* db, float* dweight, float* dbias, void* dsum,
                            const void* dout, const void* sum, const float* weight, const float* mean,
                            const float* rstd, DType t, int N, int C) {
  norm_backward_blocks(dsum, dweight, dbias, t, N, C, [&](int64_t r0, int64_t rows, float* g, float* slot) {
    be.run(k::LayerNormBackward(g, dweight ? slot : nullptr, dbias ? slot + C : nullptr,
                          widen(1, dout, t, r0 * C, rows * C), widen(0, sum, t, r0 * C, rows * C), weight,
                          mean + r0, rstd + r0, static_cast<int>(rows), C));
  }, add_total(be, da, db, dsum, t, C));
}
void add_rmsnorm_forward(Backend& be, void* sum, void* out, float* rstd, const void* a, const void* b,
                         const float* weight, DType t, int N, int C, float eps) {
  add_norm_forward_tiles(be, sum, out, a, b, t, N, C, [&](float* y, const float* x, int64_t r0, int64_t rows) {
    be.run(k::RmsNormForward(y, rstd ? rstd + r0 : nullptr, x, weight, static_cast<int>(rows), C, eps));
  });
}
void add_rmsnorm_backward(Backend& be, void* da, void* db, float* dweight, void* dsum, const void* dout,
                          const void* sum, const float* weight, const float* rstd, DType t, int N, int C) {
  norm_backward_blocks(dsum, dweight, nullptr, t, N, C, [&](int64_t r0, int64_t rows, float* g, float* slot) {
    be.run(k::RmsNormBackward(g, dweight ? slot : nullptr, widen(1, dout, t, r0 * C, rows * C),
                        widen(0, sum, t, r0 * C, rows * C), weight, rstd + r0, static_cast<int>(rows), C));
  }, add_total(be, da, db, dsum, t, C));
}

// Tiles of rows that never cross a sequence, as the widened path's kernel sees them: the
// table is stored in t and never widened whole (for GPT-2's 50257 x 768 wte that copy was a
// 147 MiB write and read per call). A tile widens only the rows it reads: wpe's rows t0 ..
// t0 + rows - 1 (one contiguous run, positions of one sequence) and each token's wte row,
// straight into the output tile, then adds in fp32 and rounds once. Widening is exact, so the
// tile holds the fp32 kernel's w + p (or w, or p, or 0: a token outside [0, V) has no row, as
// wte_row says), and the result is bit-identical to the widened path's.
void embedding_forward(Backend&, void* out, DType t, const int32_t* tokens, const void* wte, const void* wpe,
                       int B, int T, int C) {
  const int64_t tr = std::min<int64_t>(tile_rows(C), T), per = (T + tr - 1) / tr;
  cpu::parallel_blocks(static_cast<int64_t>(B) * per, 1, [&](int64_t i, int64_t, int) {
    const int64_t t0 = (i % per) * tr, rows = std::min<int64_t>(tr, T - t0), r0 = (i / per) * T + t0;
    float* y = buf(0, rows * C);
    const float* p = wpe ? widen(1, wpe, t, t0 * C, rows * C) : nullptr;
    for (int64_t k = 0; k < rows; ++k) {
      float* o = y + k * C;
      const float* pk = p ? p + k * C : nullptr;
      const int32_t tok = tokens[r0 + k];
      if (tok >= 0) {
        tile_to_f32(o, at(wte, static_cast<int64_t>(tok) * C), t, C);
        if (pk) {
#pragma omp simd
          for (int64_t j = 0; j < C; ++j) o[j] += pk[j];
        }
      } else if (pk) {
        std::copy(pk, pk + C, o);
      } else {
        std::fill(o, o + C, 0.0f);
      }
    }
    round_out(out, t, r0 * C, y, rows * C);
  });
}
// Sequential over tiles (rows accumulate into the same dwte rows in row order, as in the
// fp32 kernel); the kernel splits each tile's columns over the team.
void embedding_backward(Backend& be, float* dwte, float* dwpe, const void* dout, DType t, const int32_t* tokens,
                        int B, int T, int C) {
  if (!dwte && !dwpe) return;
  const int64_t tr = std::min<int64_t>(std::max<int64_t>(1, (int64_t{1} << 16) / C), T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t0 = 0; t0 < T; t0 += tr) {
      const int64_t rows = std::min<int64_t>(tr, T - t0), r0 = b * T + t0;
      be.run(k::EmbeddingBackward(dwte, dwpe ? dwpe + t0 * C : nullptr, widen(0, dout, t, r0 * C, rows * C),
                            tokens + r0, 1, static_cast<int>(rows), C));
    }
}

// One sequence per tile: the fp32 kernel's angle of row k is position k % T.
void rope_forward(Backend& be, void* out, const void* inp, DType t, int B, int T, int C, Heads heads, float theta) {
  const int64_t W = C + 2 * static_cast<int64_t>(heads.kv) * (C / heads.q), n = static_cast<int64_t>(T) * W;
  cpu::parallel_blocks(B, 1, [&](int64_t b, int64_t, int) {
    float* y = buf(1, n);
    be.run(k::RopeForward(y, widen(0, inp, t, b * n, n), 1, T, C, heads, theta));
    round_out(out, t, b * n, y, n);
  });
}
void rope_backward(Backend& be, void* dinp, const void* dout, DType t, int B, int T, int C, Heads heads,
                   float theta) {
  if (!dinp) return;
  const int64_t W = C + 2 * static_cast<int64_t>(heads.kv) * (C / heads.q), n = static_cast<int64_t>(T) * W;
  cpu::parallel_blocks(B, 1, [&](int64_t b, int64_t, int) {
    float* g = buf(2, n, true);
    be.run(k::RopeBackward(g, widen(0, dout, t, b * n, n), 1, T, C, heads, theta));
    fold(dinp, t, b * n, g, n);
  });
}

}  // namespace ops::native16
