// The host defaults of the Backend's memory (backend.h), the kernel table's error, and the
// compositions a backend registers as entries where it has no fused kernel of its own.
#include "ops/backend.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>

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

// Host staging: the block cache, and copies that are done on return.
void* Backend::alloc_pinned(size_t bytes) { return host_block_alloc(bytes); }
void Backend::free_pinned(void* p, size_t bytes) { host_block_free(p, bytes); }
void Backend::stage_out(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void convert_host(const k::Convert& a) {
  const DType dt = a.dt, st = a.st;
  const int64_t n = a.n;
  if (!is_float(dt) || !is_float(st))
    throw std::logic_error(std::string("convert ") + dtype_name(st) + " -> " + dtype_name(dt) + ": not a float format");
  if (n <= 0) return;
  if (dt == st) {
    std::memcpy(a.dst, a.src, static_cast<size_t>(n) * dtype_size(dt));
  } else if (st == DType::F32) {
    from_f32(a.dst, dt, static_cast<const float*>(a.src), n);
  } else if (dt == DType::F32) {
    to_f32(static_cast<float*>(a.dst), a.src, st, n);
  } else {  // bf16 <-> fp16 through fp32 pieces
    float buf[kPiece];
    for (int64_t i = 0; i < n; i += kPiece) {
      const int64_t m = std::min(kPiece, n - i);
      to_f32(buf, static_cast<const char*>(a.src) + i * 2, st, m);
      from_f32(static_cast<char*>(a.dst) + i * 2, dt, buf, m);
    }
  }
}

void accumulate_host(const k::Accumulate& a) {
  const int64_t n = a.n;
  const DType dt = a.dt;
  const float* src = a.src;
  if (n <= 0) return;
  if (dt == DType::F32) {
    float* d = static_cast<float*>(a.dst);
#pragma omp parallel for simd if (n > 65536)
    for (int64_t k = 0; k < n; ++k) d[k] += src[k];
    return;
  }
  if (!is_float(dt)) throw std::logic_error(std::string("accumulate into ") + dtype_name(dt));
  constexpr int64_t kChunk = 2048;  // dst (16-bit) = round(dst + src), through an fp32 buffer
  float tmp[kChunk];
  auto* d = static_cast<uint16_t*>(a.dst);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    to_f32(tmp, d + i, dt, m);
    for (int64_t k = 0; k < m; ++k) tmp[k] += src[i + k];
    from_f32(d + i, dt, tmp, m);
  }
}

void sum_squares_typed_composed(Backend& be, const k::SumSquaresTyped& a) {
  const int64_t n = a.n;
  const DType t = a.t;
  *a.result = 0;
  if (n <= 0) return;
  if (t == DType::F32) {
    *a.result = sum_squares(be, static_cast<const float*>(a.x), n);
    return;
  }
  if (!is_float(t)) throw std::logic_error(std::string("sum_squares of ") + dtype_name(t));
  float buf[kPiece];
  double ss = 0;
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    to_f32(buf, static_cast<const char*>(a.x) + i * 2, t, m);
    ss += sum_squares(be, buf, m);
  }
  *a.result = ss;
}

void fill_host(const k::Fill& a) {
  const int64_t n = a.n;
  const DType t = a.t;
  float v = a.v;
  if (n <= 0) return;
  if (t == DType::F32) {
    std::fill_n(static_cast<float*>(a.x), n, v);
    return;
  }
  if (!is_float(t)) throw std::logic_error(std::string("fill of ") + dtype_name(t));
  uint16_t h;
  from_f32(&h, t, &v, 1);
  std::fill_n(static_cast<uint16_t*>(a.x), n, h);
}

void adamw_update_typed_composed(Backend& be, const k::AdamwUpdateTyped& u) {
  const DType pt = u.pt, gt = u.gt;
  const int64_t n = u.n;
  const AdamwArgs& a = u.a;
  float* master = u.master;
  if (!is_float(pt) || !is_float(gt))
    throw std::logic_error(std::string("adamw_update_typed: ") + dtype_name(pt) + " parameter, " + dtype_name(gt) + " gradient");
  if (n <= 0) return;
  if (pt == DType::F32 && gt == DType::F32 && !master) {  // the whole range at once
    be.run(k::AdamwUpdate{static_cast<float*>(u.param), static_cast<const float*>(u.grad), u.m, u.v, n, a.lr,
                          a.beta1, a.beta2, a.eps, a.weight_decay, a.t, a.grad_scale});
    return;
  }
  float wbuf[kPiece], gbuf[kPiece];
  auto* w16 = static_cast<char*>(u.param);
  auto* g16 = static_cast<const char*>(u.grad);
  for (int64_t p = 0; p < n; p += kPiece) {
    const int64_t k = std::min(kPiece, n - p);
    float* wp = master ? master + p : (pt == DType::F32 ? static_cast<float*>(u.param) + p : wbuf);
    if (!master && pt != DType::F32) to_f32(wbuf, w16 + p * 2, pt, k);
    const float* gp = gt == DType::F32 ? static_cast<const float*>(u.grad) + p : gbuf;
    if (gt != DType::F32) to_f32(gbuf, g16 + p * 2, gt, k);
    be.run(k::AdamwUpdate{wp, gp, u.m + p, u.v + p, k, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.t,
                          a.grad_scale});
    if (pt != DType::F32) from_f32(w16 + p * 2, pt, wp, k);  // the compute copy
  }
}

void adamw_update_zero_grad_composed(Backend& be, const k::AdamwUpdateZeroGrad& u) {
  be.run(k::AdamwUpdateTyped{u.param, u.pt, u.grad, u.gt, u.master, u.m, u.v, u.n, u.a});
  if (u.n > 0) be.mem_zero(u.grad, static_cast<size_t>(u.n) * dtype_size(u.gt));
}

void linear_gelu_forward_composed(Backend& be, const k::LinearGeluForward& a) {
  be.run(k::MatmulForward{a.pre, a.inp, a.weight, a.bias, a.N, a.C, a.OC});
  be.run(k::GeluForward{a.out, a.pre, static_cast<int64_t>(a.N) * a.OC});
}
void linear_gelu_backward_composed(Backend& be, const k::LinearGeluBackward& a) {
  const int64_t n = static_cast<int64_t>(a.N) * a.OC;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  void* tmp = be.mem_alloc(bytes);
  be.mem_zero(tmp, bytes);
  be.run(k::GeluBackward{tmp, a.pre, a.dpre, n});
  be.copy(a.dpre, tmp, bytes);
  be.mem_free(tmp, bytes);
  be.run(k::MatmulBackward{a.dinp, a.dweight, a.dbias, a.dpre, a.inp, a.weight, a.N, a.C, a.OC});
}

void add_layernorm_forward_composed(Backend& be, const k::AddLayerNormForward& a, DType t) {
  const int64_t n = static_cast<int64_t>(a.N) * a.C;
  be.run(k::AddForward{a.sum, a.a, a.b, n}, t);
  be.run(k::LayerNormForward{a.out, a.mean, a.rstd, a.sum, a.weight, a.bias, a.N, a.C, a.eps}, t);
}
void add_layernorm_backward_composed(Backend& be, const k::AddLayerNormBackward& a, DType t) {
  const int64_t n = static_cast<int64_t>(a.N) * a.C;
  be.run(k::LayerNormBackward{a.dsum, a.dweight, a.dbias, a.dout, a.sum, a.weight, a.mean, a.rstd, a.N, a.C}, t);
  for (void* d : {a.da, a.db})
    if (d) be.run(k::AddInplace{d, a.dsum, n}, t);
}
void add_rmsnorm_forward_composed(Backend& be, const k::AddRmsNormForward& a, DType t) {
  const int64_t n = static_cast<int64_t>(a.N) * a.C;
  be.run(k::AddForward{a.sum, a.a, a.b, n}, t);
  be.run(k::RmsNormForward{a.out, a.rstd, a.sum, a.weight, a.N, a.C, a.eps}, t);
}
void add_rmsnorm_backward_composed(Backend& be, const k::AddRmsNormBackward& a, DType t) {
  const int64_t n = static_cast<int64_t>(a.N) * a.C;
  be.run(k::RmsNormBackward{a.dsum, a.dweight, a.dout, a.sum, a.weight, a.rstd, a.N, a.C}, t);
  for (void* d : {a.da, a.db})
    if (d) be.run(k::AddInplace{d, a.dsum, n}, t);
}

void embedding_forward_as_shard(Backend& be, const k::EmbeddingForward& a) {
  be.run(k::EmbeddingShardForward{static_cast<float*>(a.out), a.tokens, static_cast<const float*>(a.wte),
                                  static_cast<const float*>(a.wpe), a.B, a.T, a.C, 0,
                                  std::numeric_limits<int>::max()});
}
void embedding_backward_as_shard(Backend& be, const k::EmbeddingBackward& a) {
  be.run(k::EmbeddingShardBackward{a.dwte, a.dwpe, static_cast<const float*>(a.dout), a.tokens, a.B, a.T, a.C, 0,
                                   std::numeric_limits<int>::max()});
}

namespace {
template <class... K>
constexpr std::array<const char*, sizeof...(K)> names_of(std::tuple<K...>*) {
  return {K::name...};
}
// Each kernel's name, from its args struct (ops/kernels.h), at its Kernel's index.
constexpr auto kKernelNames = names_of(static_cast<k::AllKernels*>(nullptr));
template <class... K>
constexpr bool ids_in_order(std::tuple<K...>*) {
  int i = 0;
  return ((static_cast<int>(K::id) == i++) && ...);
}
static_assert(ids_in_order(static_cast<k::AllKernels*>(nullptr)), "AllKernels lists the kernels in Kernel order");
}  // namespace

const char* kernel_name(Kernel k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kKernelCount ? kKernelNames[static_cast<size_t>(i)] : "?";
}

void Backend::missing(Kernel k, DType t) const {
  throw std::logic_error(std::string(name()) + " backend: no " + kernel_name(k) + " kernel for " + dtype_name(t) +
                         " (its kernel table has no such entry)");
}

}  // namespace ops
