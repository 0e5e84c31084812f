// Tensor storage and the per-account memory tracker (see tensor.h).
#include "ops/tensor.h"

#include "ops/backend.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <cstring>
#include <new>
#include <stdexcept>

namespace ops {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::U8: return 1;
    case DType::F64: return 8;
    case DType::I8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
    case DType::U16: return "uint16";
    case DType::U8: return "uint8";
    case DType::F64: return "fp64";
    case DType::I8: return "int8";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "fp32" || s == "float32" || s == "f32") *out = DType::F32;
  else if (s == "bf16" || s == "bfloat16") *out = DType::BF16;
  else if (s == "fp16" || s == "float16" || s == "f16") *out = DType::F16;
  else if (s == "int32") *out = DType::I32;
  else if (s == "uint16") *out = DType::U16;
  else if (s == "uint8") *out = DType::U8;
  else if (s == "int8") *out = DType::I8;
  else if (s == "fp64" || s == "float64") *out = DType::F64;
  else return false;
  return true;
}

const char* account_name(Account a) {
  switch (a) {
    case Account::Parameters: return "parameters";
    case Account::Gradients: return "gradients";
    case Account::Optimizer: return "optimizer";
    case Account::Activations: return "activations";
    case Account::Workspace: return "workspace";
    case Account::Communication: return "communication";
    case Account::KvCache: return "kv_cache";
    case Account::Count: break;
  }
  return "?";
}

MemoryTracker& MemoryTracker::instance() {
  static MemoryTracker t;
  return t;
}

static void raise_max(std::atomic<size_t>& m, size_t v) {
  size_t cur = m.load();
  while (v > cur && !m.compare_exchange_weak(cur, v)) {}
}

void MemoryTracker::on_alloc(Account a, size_t bytes) {
  size_t now = current_[static_cast<int>(a)].fetch_add(bytes) + bytes;
  raise_max(peak_[static_cast<int>(a)], now);
  raise_max(peak_total_, current_total());
}

void MemoryTracker::on_free(Account a, size_t bytes) { current_[static_cast<int>(a)].fetch_sub(bytes); }

size_t MemoryTracker::current_total() const {
  size_t s = 0;
  for (auto& c : current_) s += c.load();
  return s;
}

void MemoryTracker::reset_peaks() {
  for (int i = 0; i < kAccounts; ++i) peak_[i].store(current_[i].load());
  peak_total_.store(current_total());
}

namespace {
struct BlockCache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;
  size_t cached = 0;
  ~BlockCache() { for (auto& [n, p] : free_blocks) std::free(p); }
};
BlockCache& block_cache() {
  static BlockCache c;
  return c;
}
size_t rounded_size(size_t n) { return (n + 63) / 64 * 64; }
}  // namespace

size_t release_cached_memory() {
  auto& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [n, p] : c.free_blocks) std::free(p);
  c.free_blocks.clear();
  size_t freed = c.cached;
  c.cached = 0;
  return freed;
}

size_t cached_memory() {
  auto& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.cached;
}

void* host_block_alloc(size_t n) {
  const size_t rounded = rounded_size(n);
  if (!rounded) return nullptr;
  void* p = nullptr;
  auto& c = block_cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(rounded);
    if (it != c.free_blocks.end()) {
      p = it->second;
      c.free_blocks.erase(it);
      c.cached -= rounded;
    }
  }
  if (!p) p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  return p;
}

void host_block_free(void* p, size_t n) {
  if (!p) return;
  auto& c = block_cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free_blocks.emplace(rounded_size(n), p);
  c.cached += rounded_size(n);
}

namespace {
Backend* g_tensor_device = nullptr;
}
Backend* tensor_device() { return g_tensor_device; }
void set_tensor_device(Backend* device) { g_tensor_device = device; }

Storage::Storage(size_t n, Account a, bool zero, Backend* dev) : bytes(n), account(a), device(dev) {
  if (rounded_size(n)) {
    if (device) {
      ptr = device->mem_alloc(rounded_size(n));
      if (zero) device->mem_zero(ptr, rounded_size(n));
    } else {
      ptr = host_block_alloc(n);
      if (zero) std::memset(ptr, 0, rounded_size(n));
    }
  }
  MemoryTracker::instance().on_alloc(account, bytes);
}

Storage::~Storage() {
  if (ptr) {
    if (device) device->mem_free(ptr, rounded_size(bytes));
    else host_block_free(ptr, bytes);
  }
  MemoryTracker::instance().on_free(account, bytes);
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Account account, bool zero)
    : Tensor(std::move(shape), dtype, account, zero, tensor_device()) {}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, Account account, bool zero, Backend* device)
    : shape_(std::move(shape)), dtype_(dtype),
      storage_(std::make_shared<Storage>(static_cast<size_t>(numel_of(shape_)) * dtype_size(dtype), account, zero,
                                         device)) {}

int64_t Tensor::numel() const { return numel_of(shape_); }

bool Tensor::on_host() const { return !storage_ || !storage_->device || storage_->device->host_memory(); }

void* Tensor::host_raw() {
  if (!on_host())
    throw std::logic_error("host access to a " + std::string(account_name(account())) + " tensor " + shape_str() +
                           " in " + storage_->device->name() + " memory");
  return raw();
}
const void* Tensor::host_raw() const { return const_cast<Tensor*>(this)->host_raw(); }

void Tensor::read_to_host(void* dst) const {
  if (!nbytes()) return;
  if (Backend* d = device()) {
    d->copy_out(dst, raw(), nbytes());
    d->synchronize();
  } else {
    std::memcpy(dst, raw(), nbytes());
  }
}

void Tensor::write_from_host(const void* src) {
  if (!nbytes()) return;
  if (Backend* d = device()) d->copy_in(raw(), src, nbytes());
  else std::memcpy(raw(), src, nbytes());
}

void Tensor::zero() {
  if (!raw()) return;
  if (Backend* d = device()) d->mem_zero(raw(), nbytes());
  else std::memset(raw(), 0, nbytes());
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  if (numel_of(shape) != numel()) throw std::logic_error("reshape " + shape_str() + " -> " + shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::view(int64_t elem_offset, std::vector<int64_t> shape) const {
  size_t off = static_cast<size_t>(elem_offset) * dtype_size(dtype_);
  size_t len = static_cast<size_t>(numel_of(shape)) * dtype_size(dtype_);
  if (!storage_ || elem_offset < 0 || offset_ + off + len > storage_->bytes)
    throw std::logic_error("view at " + std::to_string(elem_offset) + " of " + shape_to_string(shape) +
                           " outside a tensor of " + shape_str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.offset_ = offset_ + off;
  return t;
}

Tensor Tensor::clone(Account account) const {
  Tensor t(shape_, dtype_, account, false, device());
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& other) {
  if (other.numel() != numel() || other.dtype() != dtype())
    throw std::logic_error("copy_from " + other.shape_str() + " -> " + shape_str());
  if (!nbytes()) return;
  Backend* to = device();
  Backend* from = other.device();
  if (to && from && to != from)
    throw std::logic_error(std::string("copy_from between two devices (") + from->name() + " -> " + to->name() + ")");
  if (to && from) to->copy(raw(), other.raw(), nbytes());
  else if (to) to->copy_in(raw(), other.raw(), nbytes());
  else if (from) other.read_to_host(raw());
  else std::memcpy(raw(), other.raw(), nbytes());
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

}  // namespace ops
