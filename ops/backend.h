// The backend: its memory, its queue, and its kernel table (ops/kernels.h names the kernels
// and documents each one's contract). ops/cpu/ implements it (OpenBLAS + OpenMP), ops/cuda/
// (CUDA) and ops/strict/ (the strict CPU device, the CPU's kernels queued on device memory)
// too. Callers never know which one runs: be.run(k::MatmulForward(out, inp, w, b, N, C, OC)).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "ops/kernels.h"
#include "ops/tensor.h"

namespace ops {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- The backend's memory and its queue (tensors are owned by the backend) ----
  // Tensor storage (ops/tensor.h) comes from here. On the CPU it is host memory and every call
  // runs at once; on a GPU (and on the strict CPU device, ops/strict/) it is device memory that
  // host code must never dereference, and the calls below are queued in order with the kernels.
  // These defaults are the host's: the CPU backend uses them as they are.
  //
  // Whether host code may read and write this backend's memory directly.
  virtual bool host_memory() const { return true; }
  // `bytes` of memory (64-byte aligned, uninitialised; cached by size and reused); mem_free
  // returns it after every queued use (stream order), so the block may be handed out again.
  virtual void* mem_alloc(size_t bytes);
  virtual void mem_free(void* p, size_t bytes);
  // Queued: p[0, bytes) := 0.
  virtual void mem_zero(void* p, size_t bytes);
  // Queued device-to-device copy (the ranges do not overlap).
  virtual void copy(void* dst, const void* src, size_t bytes);
  // The crossings (host <-> device), each queued after the kernels before it. copy_in reads
  // `src` before it returns (the host buffer may be reused at once). copy_out's `dst` holds the
  // bytes only after synchronize(): before that it holds anything (the strict device fills it
  // with a poison pattern, so a read that forgot to wait gives wrong numbers, not lucky ones).
  virtual void copy_in(void* dst, const void* src, size_t bytes);
  virtual void copy_out(void* dst, const void* src, size_t bytes);
  // Waits for every queued call; rethrows the first error a queued kernel raised.
  virtual void synchronize() {}

  // Staging for checkpoints and the rollback snapshot (runner/checkpoint/staging.h): the host
  // buffers parameters and optimizer state are copied out into. alloc_pinned gives host memory
  // the device copies to at full speed without holding up its queue (page-locked on CUDA; the
  // host's block cache by default); host code may read it, once the copy has been waited for.
  virtual void* alloc_pinned(size_t bytes);
  virtual void free_pinned(void* p, size_t bytes);
  // copy_out on the device's side queue (a copy stream on CUDA), for an asynchronous save: it
  // sees every call queued before it; later calls that write `src` wait for it on the device,
  // not on the host. `dst` holds the bytes only after stage_wait() of a fence taken after it
  // (before that, anything: the strict device fills it with poison). Host default: a memcpy.
  virtual void stage_out(void* dst, const void* src, size_t bytes);
  // A point on the side queue after every stage_out so far, and the wait for it: any thread
  // (the checkpoint writer's) may wait, and waits only for the staged copies, not for the
  // kernels queued since; a fence is waited for once. Throws when the copies did not run.
  virtual uint64_t stage_fence() { return 0; }
  virtual void stage_wait(uint64_t fence) {}

  // ---- The kernel table (ops/kernels.h) ----
  // One entry per (Kernel, DType) the backend has: F32 for every kernel it implements, BF16 and
  // F16 for its 16-bit ones. A caller runs an entry with the kernel's argument struct; an entry
  // the backend lacks is a std::logic_error naming backend, kernel and dtype (the executor
  // checks its plan against the table first: missing_kernels, ops/executor.h).
  using AdamwArgs = ops::AdamwArgs;
  template <class K> void run(const K& args, DType t = DType::F32) {
    const Entry* e = entry(K::id, t);
    if (!e || !e->fn) missing(K::id, t);
    e->fn(&args);
  }
  // Whether run(K, t) would find an entry it may use (an entry may be conditional on the
  // machine: the CPU's 16-bit GEMM needs a oneDNN that has one).
  bool has(Kernel k, DType t) const {
    const Entry* e = entry(k, t);
    return e && e->fn && (!e->available || e->available(t));
  }
  // One entry as registered: the call on type-erased arguments, and the condition has() asks
  // (null: always). The strict device wraps every entry of the CPU backend's.
  struct Entry {
    std::function<void(const void*)> fn;
    bool (*available)(DType) = nullptr;
  };
  const Entry* entry(Kernel k, DType t) const {
    const int d = dtype_slot(t);
    return d < 0 ? nullptr : &table_[static_cast<size_t>(k)][static_cast<size_t>(d)];
  }

 protected:
  // A backend registers its entries (in its constructor): fn(const K&) runs K in dtype t.
  template <class K, class F> void provide(DType t, F fn, bool (*available)(DType) = nullptr) {
    const int d = dtype_slot(t);
    if (d < 0) throw std::logic_error(std::string("kernel table: no slot for dtype ") + dtype_name(t));
    Entry& e = table_[static_cast<size_t>(K::id)][static_cast<size_t>(d)];
    e.fn = [fn = std::move(fn)](const void* a) { fn(*static_cast<const K*>(a)); };
    e.available = available;
  }
  // The same entry for F32, BF16 and F16 (a kernel whose dtypes are its fields, or one that
  // takes the dtype from the key: fn(const K&, DType)).
  template <class K, class F> void provide_all(F fn) {
    for (DType t : {DType::F32, DType::BF16, DType::F16}) provide<K>(t, [fn, t](const K& a) { fn(a, t); });
  }
  // The F32 entries a backend implements as fp32 member functions of the common signatures
  // (ops/backend_fp32.h, which defines it: the CPU and CUDA backends).
  template <class Self> void provide_fp32_members(Self* self);
  // The BF16 and F16 entries of K: fn(const K&, DType).
  template <class K, class F> void provide16(F fn) {
    for (DType t : {DType::BF16, DType::F16}) provide<K>(t, [fn, t](const K& a) { fn(a, t); });
  }

 private:
  static int dtype_slot(DType t) {
    return t == DType::F32 ? 0 : t == DType::BF16 ? 1 : t == DType::F16 ? 2 : -1;
  }
  [[noreturn]] void missing(Kernel k, DType t) const;
  std::array<std::array<Entry, 3>, kKernelCount> table_{};
};


// The kernels that return a value to the host, as functions.
inline double sum_squares(Backend& be, const float* x, int64_t n) {
  double r = 0;
  be.run(k::SumSquares{x, n, &r});
  return r;
}
inline double sum_squares_typed(Backend& be, const void* x, DType t, int64_t n) {
  double r = 0;
  be.run(k::SumSquaresTyped{x, t, n, &r});
  return r;
}

// ---- Compositions: entries built from other entries, written once ----
// A backend without a fused kernel registers these (ops/backend.cpp). Each runs the backend's
// own entries in the order the unfused executor path does, so that any fused kernel must
// equal them bit for bit.
// The host's generic kernels (F32 entries; the dtypes are fields).
void convert_host(const k::Convert& a);
void accumulate_host(const k::Accumulate& a);
void fill_host(const k::Fill& a);
// SumSquaresTyped: F32 through be's SumSquares, 16-bit in pieces widened on the host.
void sum_squares_typed_composed(Backend& be, const k::SumSquaresTyped& a);
// AdamwUpdateTyped: fp32-only ranges in one AdamwUpdate, the others in host pieces.
void adamw_update_typed_composed(Backend& be, const k::AdamwUpdateTyped& a);
// AdamwUpdateZeroGrad: AdamwUpdateTyped, then mem_zero of the gradient.
void adamw_update_zero_grad_composed(Backend& be, const k::AdamwUpdateZeroGrad& a);
// LinearGelu: MatmulForward then GeluForward; GeluBackward into a zeroed temporary, copied
// over dpre, then MatmulBackward.
void linear_gelu_forward_composed(Backend& be, const k::LinearGeluForward& a);
void linear_gelu_backward_composed(Backend& be, const k::LinearGeluBackward& a);
// AddNorm in dtype t: AddForward then the norm's forward; the norm's backward into dsum then
// AddInplace into da and db (the same dtype's entries).
void add_layernorm_forward_composed(Backend& be, const k::AddLayerNormForward& a, DType t);
void add_layernorm_backward_composed(Backend& be, const k::AddLayerNormBackward& a, DType t);
void add_rmsnorm_forward_composed(Backend& be, const k::AddRmsNormForward& a, DType t);
void add_rmsnorm_backward_composed(Backend& be, const k::AddRmsNormBackward& a, DType t);
// The unsharded embedding is the shard that holds the whole table (EmbeddingShard*, vstart 0).
void embedding_forward_as_shard(Backend& be, const k::EmbeddingForward& a);
void embedding_backward_as_shard(Backend& be, const k::EmbeddingBackward& a);

// The CPU backend (OpenBLAS + OpenMP). Thread count comes from OpenMP (OMP_NUM_THREADS
// or set_num_threads()).
Backend& cpu_backend();
void set_num_threads(int n);
int num_threads();

}  // namespace ops
