// The host defaults of the Backend's memory and generic kernels (backend.h): what the CPU
// backend uses as they are. A device backend (ops/cuda/, ops/strict/) overrides every one.
#include "ops/backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ops/convert.h"

namespace ops {

namespace {
bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }
// 16-bit tensors are widened in pieces of this many elements (fixed scratch on the stack).
constexpr int64_t kPiece = 1 << 14;
}  // namespace

void* Backend::mem_alloc(size_t bytes) { return host_block_alloc(bytes); }
void Backend::mem_free(void* p, size_t bytes) { host_block_free(p, bytes); }
void Backend::mem_zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}
void Backend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void Backend::copy_in(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void Backend::copy_out(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

// [i26: train and checkpoint] host staging: the block cache, and copies that are done on return.
void* Backend::alloc_pinned(size_t bytes) { return host_block_alloc(bytes); }
void Backend::free_pinned(void* p, size_t bytes) { host_block_free(p, bytes); }
void Backend::stage_out(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void Backend::convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
  if (!is_float(dt) || !is_float(st))
    throw std::logic_error(std::string("convert ") + dtype_name(st) + " -> " + dtype_name(dt) + ": not a float format");
  if (n <= 0) return;
  if (dt == st) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dt));
  } else if (st == DType::F32) {
    from_f32(dst, dt, static_cast<const float*>(src), n);
  } else if (dt == DType::F32) {
    to_f32(static_cast<float*>(dst), src, st, n);
  } else {  // bf16 <-> fp16 through fp32 pieces
    float buf[kPiece];
    for (int64_t a = 0; a < n; a += kPiece) {
      const int64_t m = std::min(kPiece, n - a);
      to_f32(buf, static_cast<const char*>(src) + a * 2, st, m);
      from_f32(static_cast<char*>(dst) + a * 2, dt, buf, m);
    }
  }
}

void Backend::accumulate(void* dst, DType dt, const float* src, int64_t n) {
  if (n <= 0) return;
  if (dt == DType::F32) {
    float* d = static_cast<float*>(dst);
#pragma omp parallel for simd if (n > 65536)
    for (int64_t k = 0; k < n; ++k) d[k] += src[k];
    return;
  }
  if (!is_float(dt)) throw std::logic_error(std::string("accumulate into ") + dtype_name(dt));
  constexpr int64_t kChunk = 2048;  // dst (16-bit) = round(dst + src), through an fp32 buffer
  float tmp[kChunk];
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t a = 0; a < n; a += kChunk) {
    const int64_t m = std::min(kChunk, n - a);
    to_f32(tmp, d + a, dt, m);
    for (int64_t k = 0; k < m; ++k) tmp[k] += src[a + k];
    from_f32(d + a, dt, tmp, m);
  }
}

double Backend::sum_squares_typed(const void* x, DType t, int64_t n) {
  if (n <= 0) return 0;
  if (t == DType::F32) return sum_squares(static_cast<const float*>(x), n);
  if (!is_float(t)) throw std::logic_error(std::string("sum_squares of ") + dtype_name(t));
  float buf[kPiece];
  double ss = 0;
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    to_f32(buf, static_cast<const char*>(x) + i * 2, t, m);
    ss += sum_squares(buf, m);
  }
  return ss;
}

void Backend::fill(void* x, DType t, float v, int64_t n) {
  if (n <= 0) return;
  if (t == DType::F32) {
    std::fill_n(static_cast<float*>(x), n, v);
    return;
  }
  if (!is_float(t)) throw std::logic_error(std::string("fill of ") + dtype_name(t));
  uint16_t h;
  from_f32(&h, t, &v, 1);
  std::fill_n(static_cast<uint16_t*>(x), n, h);
}

// [i26: ops step path]
void Backend::adamw_update_typed(void* param, DType pt, const void* grad, DType gt, float* master, float* m, float* v,
                                 int64_t n, const AdamwArgs& a) {
  if (!is_float(pt) || !is_float(gt))
    throw std::logic_error(std::string("adamw_update_typed: ") + dtype_name(pt) + " parameter, " + dtype_name(gt) + " gradient");
  if (n <= 0) return;
  if (pt == DType::F32 && gt == DType::F32 && !master) {  // the whole range at once
    adamw_update(static_cast<float*>(param), static_cast<const float*>(grad), m, v, n, a.lr, a.beta1, a.beta2, a.eps,
                 a.weight_decay, a.t, a.grad_scale);
    return;
  }
  float wbuf[kPiece], gbuf[kPiece];
  auto* w16 = static_cast<char*>(param);
  auto* g16 = static_cast<const char*>(grad);
  for (int64_t p = 0; p < n; p += kPiece) {
    const int64_t k = std::min(kPiece, n - p);
    float* wp = master ? master + p : (pt == DType::F32 ? static_cast<float*>(param) + p : wbuf);
    if (!master && pt != DType::F32) to_f32(wbuf, w16 + p * 2, pt, k);
    const float* gp = gt == DType::F32 ? static_cast<const float*>(grad) + p : gbuf;
    if (gt != DType::F32) to_f32(gbuf, g16 + p * 2, gt, k);
    adamw_update(wp, gp, m + p, v + p, k, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.t, a.grad_scale);
    if (pt != DType::F32) from_f32(w16 + p * 2, pt, wp, k);  // the compute copy
  }
}

// [i29: fused] The composed default (backend.h): what the fused kernels must equal, bit for bit.
void Backend::linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias,
                                  int N, int C, int OC) {
  matmul_forward(pre, inp, weight, bias, N, C, OC);
  gelu_forward(out, pre, static_cast<int64_t>(N) * OC);
}
void Backend::linear_gelu_backward(float* dinp, float* dweight, float* dbias, float* dpre, const float* pre,
                                   const float* inp, const float* weight, int N, int C, int OC) {
  const int64_t n = static_cast<int64_t>(N) * OC;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  void* tmp = mem_alloc(bytes);
  mem_zero(tmp, bytes);
  gelu_backward(static_cast<float*>(tmp), pre, dpre, n);
  copy(dpre, tmp, bytes);
  mem_free(tmp, bytes);
  matmul_backward(dinp, dweight, dbias, dpre, inp, weight, N, C, OC);
}

// [i29: optimizer]
void Backend::adamw_update_zero_grad(void* param, DType pt, void* grad, DType gt, float* master, float* m, float* v,
                                     int64_t n, const AdamwArgs& a) {
  adamw_update_typed(param, pt, grad, gt, master, m, v, n, a);
  if (n > 0) mem_zero(grad, static_cast<size_t>(n) * dtype_size(gt));
}

// [i29: native16] No 16-bit-native kernels by default (native16_available is false, so the
// executor never calls these on such a backend).
// [i29: fused] AddNorm's composed defaults (backend.h): the unfused Add and norm calls in the
// executor's order, so any backend that has those has these, and the CPU's fused kernels must
// equal them bit for bit. F32 runs the fp32 kernels, BF16/F16 the 16-bit-native ones.
void Backend::add_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* a, const void* b,
                                    const float* weight, const float* bias, DType t, int N, int C, float eps) {
  const int64_t n = static_cast<int64_t>(N) * C;
  if (t == DType::F32) {
    add_forward(static_cast<float*>(sum), static_cast<const float*>(a), static_cast<const float*>(b), n);
    layernorm_forward(static_cast<float*>(out), mean, rstd, static_cast<const float*>(sum), weight, bias, N, C, eps);
    return;
  }
  add_forward16(sum, a, b, t, n);
  layernorm_forward16(out, mean, rstd, sum, weight, bias, t, N, C, eps);
}
void Backend::add_layernorm_backward(void* da, void* db, float* dweight, float* dbias, void* dsum, const void* dout,
                                     const void* sum, const float* weight, const float* mean, const float* rstd,
                                     DType t, int N, int C) {
  const int64_t n = static_cast<int64_t>(N) * C;
  if (t == DType::F32) {
    layernorm_backward(static_cast<float*>(dsum), dweight, dbias, static_cast<const float*>(dout),
                       static_cast<const float*>(sum), weight, mean, rstd, N, C);
    for (void* d : {da, db})
      if (d) add_inplace(static_cast<float*>(d), static_cast<const float*>(dsum), n);
    return;
  }
  layernorm_backward16(dsum, dweight, dbias, dout, sum, weight, mean, rstd, t, N, C);
  for (void* d : {da, db})
    if (d) add_inplace16(d, dsum, t, n);
}
void Backend::add_rmsnorm_forward(void* sum, void* out, float* rstd, const void* a, const void* b,
                                  const float* weight, DType t, int N, int C, float eps) {
  const int64_t n = static_cast<int64_t>(N) * C;
  if (t == DType::F32) {
    add_forward(static_cast<float*>(sum), static_cast<const float*>(a), static_cast<const float*>(b), n);
    rmsnorm_forward(static_cast<float*>(out), rstd, static_cast<const float*>(sum), weight, N, C, eps);
    return;
  }
  add_forward16(sum, a, b, t, n);
  rmsnorm_forward16(out, rstd, sum, weight, t, N, C, eps);
}
void Backend::add_rmsnorm_backward(void* da, void* db, float* dweight, void* dsum, const void* dout, const void* sum,
                                   const float* weight, const float* rstd, DType t, int N, int C) {
  const int64_t n = static_cast<int64_t>(N) * C;
  if (t == DType::F32) {
    rmsnorm_backward(static_cast<float*>(dsum), dweight, static_cast<const float*>(dout),
                     static_cast<const float*>(sum), weight, rstd, N, C);
    for (void* d : {da, db})
      if (d) add_inplace(static_cast<float*>(d), static_cast<const float*>(dsum), n);
    return;
  }
  rmsnorm_backward16(dsum, dweight, dout, sum, weight, rstd, t, N, C);
  for (void* d : {da, db})
    if (d) add_inplace16(d, dsum, t, n);
}

namespace {
[[noreturn]] void no_native16(const Backend& be, const char* what) {
  throw std::logic_error(std::string(be.name()) + " backend: no 16-bit-native " + what);
}
}  // namespace
void Backend::embedding_forward16(void*, DType, const int32_t*, const void*, const void*, int, int, int) {
  no_native16(*this, "embedding");
}
void Backend::embedding_backward16(float*, float*, const void*, DType, const int32_t*, int, int, int) {
  no_native16(*this, "embedding");
}
void Backend::layernorm_forward16(void*, float*, float*, const void*, const float*, const float*, DType, int, int,
                                  float) {
  no_native16(*this, "layernorm");
}
void Backend::layernorm_backward16(void*, float*, float*, const void*, const void*, const float*, const float*,
                                   const float*, DType, int, int) {
  no_native16(*this, "layernorm");
}
void Backend::rmsnorm_forward16(void*, float*, const void*, const float*, DType, int, int, float) {
  no_native16(*this, "rmsnorm");
}
void Backend::rmsnorm_backward16(void*, float*, const void*, const void*, const float*, const float*, DType, int,
                                 int) {
  no_native16(*this, "rmsnorm");
}
void Backend::rope_forward16(void*, const void*, DType, int, int, int, Heads, float) { no_native16(*this, "rope"); }
void Backend::rope_backward16(void*, const void*, DType, int, int, int, Heads, float) { no_native16(*this, "rope"); }
void Backend::gelu_forward16(void*, const void*, DType, int64_t) { no_native16(*this, "gelu"); }
void Backend::gelu_backward16(void*, const void*, const void*, DType, int64_t) { no_native16(*this, "gelu"); }
void Backend::swiglu_forward16(void*, const void*, DType, int, int) { no_native16(*this, "swiglu"); }
void Backend::swiglu_backward16(void*, const void*, const void*, DType, int, int) { no_native16(*this, "swiglu"); }
void Backend::add_forward16(void*, const void*, const void*, DType, int64_t) { no_native16(*this, "add"); }
void Backend::add_inplace16(void*, const void*, DType, int64_t) { no_native16(*this, "add"); }
void Backend::dropout_forward16(void*, const void*, DType, int64_t, DropoutSpec) { no_native16(*this, "dropout"); }
void Backend::dropout_backward16(void*, const void*, DType, int64_t, DropoutSpec) { no_native16(*this, "dropout"); }
void Backend::attention_forward16(void*, float*, const void*, DType, int, int, int, Heads, DropoutSpec) {
  no_native16(*this, "attention");
}
void Backend::attention_backward16(void*, const void*, const void*, const float*, DType, int, int, int, Heads,
                                   DropoutSpec, float*) {
  no_native16(*this, "attention");
}

}  // namespace ops
