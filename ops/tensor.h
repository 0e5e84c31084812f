// Tensors and the accounting allocator.
//
// Every byte the runner allocates is tagged with one ledger account (parameters,
// gradients, optimizer, activations, workspace, communication), so that the measured
// peak of each account can be compared with the plan's prediction (docs/invariants.md,
// invariant 4). A Tensor is a shape, a dtype and a shared storage block; it knows
// nothing of recipes, ranks or files.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ops {

enum class DType : uint8_t { F32, BF16, F16, I32, U16, U8, F64, I8 };
size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "fp32"/"float32"/"f32", "bf16", "fp16"/"f16", "int32", "uint16", "uint8", "int8", "fp64".
bool parse_dtype(const std::string& s, DType* out);

// KvCache: the inference KV cache (ops/kv_cache.h), allocated once per generation request.
enum class Account : uint8_t { Parameters, Gradients, Optimizer, Activations, Workspace, Communication, KvCache, Count };
constexpr int kAccounts = static_cast<int>(Account::Count);
const char* account_name(Account a);

// Process-wide counters of live and peak bytes per account. Thread-safe.
class MemoryTracker {
 public:
  static MemoryTracker& instance();
  void on_alloc(Account a, size_t bytes);
  void on_free(Account a, size_t bytes);
  size_t current(Account a) const { return current_[static_cast<int>(a)].load(); }
  size_t peak(Account a) const { return peak_[static_cast<int>(a)].load(); }
  size_t current_total() const;
  size_t peak_total() const { return peak_total_.load(); }
  void reset_peaks();  // peaks := current values
 private:
  std::array<std::atomic<size_t>, kAccounts> current_{};
  std::array<std::atomic<size_t>, kAccounts> peak_{};
  std::atomic<size_t> peak_total_{0};
};

class Backend;  // ops/backend.h: owns device memory and the queue its kernels run on

// The device new tensors are allocated on (Tensor's constructors without a device): null, the
// host (the default), or the backend a run selected (runner/device/device.cpp sets it once,
// before the model is built). Host memory is what tests and host-side tools use.
Backend* tensor_device();
void set_tensor_device(Backend* device);

// Host memory blocks, 64-byte aligned, cached by size (the host's allocator; Backend's default).
void* host_block_alloc(size_t bytes);
void host_block_free(void* p, size_t bytes);

// One 64-byte aligned block of a device's memory (device null: host memory), freed (and
// un-counted) when the last Tensor drops it.
struct Storage {
  Storage(size_t bytes, Account account, bool zero, Backend* device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* ptr = nullptr;
  size_t bytes = 0;
  Account account;
  Backend* device = nullptr;
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-initialised storage (zero=false leaves it uninitialised) on tensor_device().
  Tensor(std::vector<int64_t> shape, DType dtype, Account account, bool zero = true);
  // ... on `device` (null: host memory).
  Tensor(std::vector<int64_t> shape, DType dtype, Account account, bool zero, Backend* device);
  // Host memory whatever the run's device: a batch being read, a staging buffer, a tool's tensor.
  static Tensor host(std::vector<int64_t> shape, DType dtype, Account account, bool zero = true) {
    return Tensor(std::move(shape), dtype, account, zero, nullptr);
  }
  static Tensor zeros(std::vector<int64_t> shape, DType dtype, Account account) {
    return Tensor(std::move(shape), dtype, account, true);
  }
  static Tensor empty(std::vector<int64_t> shape, DType dtype, Account account) {
    return Tensor(std::move(shape), dtype, account, false);
  }

  bool defined() const { return storage_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Account account() const { return storage_ ? storage_->account : Account::Workspace; }

  // The storage's device (null: host memory) and whether host code may dereference it.
  Backend* device() const { return storage_ ? storage_->device : nullptr; }
  bool on_host() const;

  // Pointers into the tensor's memory: device pointers for a device tensor, to pass to its
  // backend's kernels and copies, never to dereference on the host (on the strict device,
  // ops/strict/, such a read faults at the line that made it).
  void* raw() { return storage_ ? static_cast<char*>(storage_->ptr) + offset_ : nullptr; }
  const void* raw() const { return storage_ ? static_cast<const char*>(storage_->ptr) + offset_ : nullptr; }
  template <class T> T* data() { return static_cast<T*>(raw()); }
  template <class T> const T* data() const { return static_cast<const T*>(raw()); }
  // Host pointers: throw std::logic_error (naming the tensor's shape and account) unless on_host().
  template <class T> T* host_data() { return static_cast<T*>(host_raw()); }
  template <class T> const T* host_data() const { return static_cast<const T*>(host_raw()); }
  void* host_raw();
  const void* host_raw() const;

  // The named crossings between host memory and the tensor's (whatever its device):
  // read_to_host copies nbytes() out and waits for them; write_from_host copies nbytes() in
  // (queued after earlier kernels; `src` may be reused on return).
  void read_to_host(void* dst) const;
  void write_from_host(const void* src);

  void zero();  // queued on a device
  // A view with another shape over the same storage (numel must match).
  Tensor reshape(std::vector<int64_t> shape) const;
  // A view of `shape` starting `elem_offset` elements into this tensor's storage (sharing it;
  // the bytes stay counted once, in this tensor's account). Flat gradient and parameter
  // buffers hand out one view per parameter, so buckets and ZeRO shards are contiguous ranges.
  Tensor view(int64_t elem_offset, std::vector<int64_t> shape) const;
  Tensor clone(Account account) const;  // on the same device
  // Same numel and dtype; across devices (host <-> device) it is a crossing (waits when the
  // destination is the host).
  void copy_from(const Tensor& other);
  std::string shape_str() const;

 private:
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
};

// Storage blocks are cached by size and reused (shapes repeat every micro-batch), so the
// training loop does not pay for malloc and page faults each step. The tracker counts bytes
// in use, not bytes cached. Returns the cached bytes freed.
size_t release_cached_memory();
size_t cached_memory();

int64_t numel_of(const std::vector<int64_t>& shape);
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace ops
