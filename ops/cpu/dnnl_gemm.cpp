// oneDNN matmul for 16-bit GEMMs (see dnnl_gemm.h). Transposes are strides on the memory
// descriptors (no copies); accumulation (C +=) is oneDNN's sum post-op; the bias is fp32.
// oneDNN's own scratchpad and weight packing live in its allocator, outside the accounting
// allocator (as OpenBLAS's packing buffers do): the ledger does not count them.
#include "ops/cpu/dnnl_gemm.h"

#include <stdexcept>

#ifdef RUNNER_HAVE_DNNL
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include <dnnl.hpp>
#include <omp.h>
#endif

namespace ops::cpu {

#ifdef RUNNER_HAVE_DNNL
namespace {

using dt = dnnl::memory::data_type;

dt dnnl_type(DType t) {
  if (t == DType::BF16) return dt::bf16;
  if (t == DType::F16) return dt::f16;
  throw std::logic_error(std::string("dnnl_gemm: no 16-bit GEMM for ") + dtype_name(t));
}

// (dtype, trans_a, trans_b, M, N, K, lda, ldb, ldc, bias, accumulate, threads). oneDNN fixes a
// primitive's split across threads when it creates it, for the thread count of that moment:
// a process that changes its count (ops::set_num_threads) gets a primitive for the new one.
using Key = std::tuple<int, bool, bool, int, int, int, int, int, int, bool, bool, int>;

struct Prim {
  dnnl::memory::desc a, b, c, bias;
  dnnl::matmul matmul;
  dnnl::memory::desc scratch;  // the call's own scratchpad (user mode, see get)
  std::string impl;
};

struct Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;
  std::map<Key, std::shared_ptr<Prim>> cache;

  // The primitive for a key, created on first use; null when oneDNN has none for it.
  std::shared_ptr<Prim> get(const Key& k) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(k);
    if (it != cache.end()) return it->second;
    auto [t, ta, tb, M, N, K, lda, ldb, ldc, has_bias, acc, threads] = k;
    auto p = std::make_shared<Prim>();
    const dt type = dnnl_type(static_cast<DType>(t));
    using dims = dnnl::memory::dims;
    p->a = dnnl::memory::desc({M, K}, type, ta ? dims{1, lda} : dims{lda, 1});
    p->b = dnnl::memory::desc({K, N}, type, tb ? dims{1, ldb} : dims{ldb, 1});
    p->c = dnnl::memory::desc({M, N}, dt::f32, dims{ldc, 1});
    if (has_bias) p->bias = dnnl::memory::desc({1, N}, dt::f32, dims{N, 1});
    dnnl::primitive_attr attr;
    // oneDNN built without DNNL_ENABLE_CONCURRENT_EXEC (Debian's) shares one scratchpad among all
    // primitives: two calls at once (dnnl_dweight_fixed's tiles) would write each other's. Each
    // call passes its own (thread-local) scratchpad instead.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (acc) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    try {
      dnnl::matmul::desc d = has_bias ? dnnl::matmul::desc(p->a, p->b, p->bias, p->c) : dnnl::matmul::desc(p->a, p->b, p->c);
      dnnl::matmul::primitive_desc pd(d, attr, engine);
      p->impl = pd.impl_info_str();
      p->scratch = pd.scratchpad_desc();
      p->matmul = dnnl::matmul(pd);
    } catch (const dnnl::error&) {
      p = nullptr;
    }
    cache.emplace(k, p);
    return p;
  }
};

Dnnl& dnnl_state() {
  static Dnnl d;
  return d;
}

// The implementation oneDNN picks for a small plain GEMM: "" when it has none.
std::string probe(DType t) {
  auto p = dnnl_state().get(Key{static_cast<int>(t), false, true, 64, 64, 64, 64, 64, 64, false, false, omp_get_max_threads()});
  return p ? p->impl : std::string();
}

}  // namespace

bool dnnl_gemm_available(DType t) {
  if (t != DType::BF16 && t != DType::F16) return false;
  const std::string impl = probe(t);
  return !impl.empty() && impl.rfind("ref", 0) != 0;
}

std::string dnnl_gemm_info(DType t) {
  if (t != DType::BF16 && t != DType::F16) return "oneDNN: no 16-bit GEMM for this dtype";
  const std::string impl = probe(t);
  if (impl.empty()) return std::string("oneDNN ") + std::to_string(dnnl_version()->major) + "." +
                           std::to_string(dnnl_version()->minor) + " has no " + dtype_name(t) + " matmul on this CPU";
  if (impl.rfind("ref", 0) == 0) return "oneDNN's " + std::string(dtype_name(t)) + " matmul is its reference code here (" + impl + ")";
  return impl;
}

void dnnl_gemm(DType t, bool trans_a, bool trans_b, int M, int N, int K, const void* A, int lda, const void* B,
               int ldb, const float* bias, bool accumulate, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  Dnnl& d = dnnl_state();
  auto p = d.get(Key{static_cast<int>(t), trans_a, trans_b, M, N, K, lda, ldb, ldc, bias != nullptr, accumulate,
                    omp_get_max_threads()});
  if (!p) throw std::logic_error(std::string("dnnl_gemm: oneDNN has no ") + dtype_name(t) + " matmul for this shape");
  // A stream is not for concurrent use: calls from inside a parallel region (the fixed tiles of
  // ops/cpu/cpu_backend.cpp's dnnl_dweight_fixed) each take their own.
  std::optional<dnnl::stream> own;
  if (omp_in_parallel()) own.emplace(d.engine);
  dnnl::stream& stream = own ? *own : d.stream;
  dnnl::memory a(p->a, d.engine, const_cast<void*>(A)), b(p->b, d.engine, const_cast<void*>(B)), c(p->c, d.engine, C);
  thread_local std::vector<char> scratch;  // grows to the largest scratchpad this thread needed
  if (scratch.size() < p->scratch.get_size()) scratch.resize(p->scratch.get_size());
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c},
                                             {DNNL_ARG_SCRATCHPAD, dnnl::memory(p->scratch, d.engine, scratch.data())}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p->bias, d.engine, const_cast<float*>(bias)));
  p->matmul.execute(stream, args);
  stream.wait();
}

#else  // built without oneDNN

bool dnnl_gemm_available(DType) { return false; }
std::string dnnl_gemm_info(DType) { return "built without oneDNN (libdnnl-dev)"; }
void dnnl_gemm(DType, bool, bool, int, int, int, const void*, int, const void*, int, const float*, bool, float*, int) {
  throw std::logic_error("dnnl_gemm: built without oneDNN");
}

#endif

}  // namespace ops::cpu
