// The strict CPU device (strict_backend.h): an arena mapped twice (PROT_NONE for host code,
// read-write for the kernels) and a queue thread that runs the CPU backend's kernels in order.
#include "ops/strict/strict_backend.h"

#include <execinfo.h>
#include <omp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ops/knobs.h"

namespace ops::strict {

namespace {

std::atomic<int64_t> g_copies_in{0}, g_copies_out{0}, g_queued{0};

size_t host_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  while (f >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024;
    f.ignore(256, '\n');
  }
  return size_t{16} << 30;
}

size_t rounded(size_t n) { return (n + 63) / 64 * 64; }

// The device memory: one memfd mapped twice. Blocks are cached by size and reused (like the
// host's block cache and CUDA's caching allocators); a freed block's pages stay committed.
class Arena {
 public:
  Arena() {
    size_t cap = host_memory_bytes();
    if (const auto gib = ops::knobs().strict_arena_gib) cap = static_cast<size_t>(*gib * (1ull << 30));
    cap = rounded(cap);
    fd_ = memfd_create("runner-strict-device", 0);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(cap)) != 0)
      throw std::runtime_error(std::string("strict device: cannot create its memory (memfd): ") + std::strerror(errno));
    void* h = mmap(nullptr, cap, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
    void* k = mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
    if (h == MAP_FAILED || k == MAP_FAILED)
      throw std::runtime_error(std::string("strict device: cannot map its memory: ") + std::strerror(errno));
    host_view_ = static_cast<char*>(h);
    kernel_view_ = static_cast<char*>(k);
    cap_ = cap;
  }
  void* alloc(size_t bytes) {
    const size_t n = rounded(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(n);
    size_t off;
    if (it != free_.end()) {
      off = it->second;
      free_.erase(it);
    } else {
      if (top_ + n > cap_) throw std::bad_alloc();
      off = top_;
      top_ += n;
    }
    in_use_ += n;
    return host_view_ + off;
  }
  void free(void* p, size_t bytes) {
    const size_t n = rounded(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(n, static_cast<size_t>(static_cast<char*>(p) - host_view_));
    in_use_ -= n;
  }
  bool contains(const void* p) const {
    auto* c = static_cast<const char*>(p);
    return c >= host_view_ && c < host_view_ + cap_;
  }
  // The kernels' address of device pointer p.
  template <class T> T* kernel(T* p) const {
    if (!p) return nullptr;
    if (!contains(p))
      throw std::logic_error("strict device: a kernel was given a host pointer (every buffer a kernel reads or writes must "
                             "be device memory: a tensor of the run's device; copy_in a host buffer first)");
    using C = std::conditional_t<std::is_const_v<T>, const char, char>;
    return reinterpret_cast<T*>(kernel_view_ + (reinterpret_cast<C*>(p) - host_view_));
  }
  size_t in_use() const { return in_use_; }
  size_t top() const { return top_; }

 private:
  int fd_ = -1;
  char* host_view_ = nullptr;
  char* kernel_view_ = nullptr;
  size_t cap_ = 0, top_ = 0, in_use_ = 0;
  std::mutex mu_;
  std::multimap<size_t, size_t> free_;
};

// The device's queue: one thread runs the submitted calls in order.
class Queue {
 public:
  Queue() : worker_([this] { run(); }) {}
  ~Queue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  // `always`: runs even after an earlier call failed (a free: the memory must come back).
  void submit(std::function<void()> f, bool always = false) {
    const int threads = omp_get_max_threads();  // the caller's thread count, for the kernels
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back({[f = std::move(f), threads] {
        if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
        f();
      }, always});
      ++queued_;
      ++g_queued;
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [this] { return q_.empty() && !busy_; });
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  int64_t queued() const { return queued_; }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;  // stop_ and nothing left
      Item item = std::move(q_.front());
      q_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        // After an error the rest of the queue is dropped until synchronize(), frees excepted.
        if (!error_ || item.always) item.f();
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (q_.empty()) idle_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Item {
    std::function<void()> f;
    bool always = false;
  };
  std::deque<Item> q_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::atomic<int64_t> queued_{0};
  std::thread worker_;
};

std::atomic<Arena*> g_arena{nullptr};


class StrictBackend final : public Backend {
 public:
  StrictBackend() : cpu_(cpu_backend()) { g_arena.store(&arena_); }
  const char* name() const override { return "cpu-strict"; }

  // ---- memory and queue ----
  bool host_memory() const override { return false; }
  void* mem_alloc(size_t bytes) override { return arena_.alloc(bytes); }
  void mem_free(void* p, size_t bytes) override {
    // Stream order: the block returns to the cache after every call queued before the free.
    queue_.submit([this, p, bytes] { arena_.free(p, bytes); }, /*always=*/true);
  }
  void mem_zero(void* p, size_t bytes) override {
    submit([p = dev(p), bytes] { std::memset(p, 0, bytes); });
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    submit([dst = dev(dst), src = dev(src), bytes] { std::memcpy(dst, src, bytes); });
  }
  void copy_in(void* dst, const void* src, size_t bytes) override {
    if (arena_.contains(src)) throw std::logic_error("strict device: copy_in from device memory (use copy)");
    ++g_copies_in;
    std::shared_ptr<char[]> staged(new char[bytes]);  // the host buffer is free again on return
    std::memcpy(staged.get(), src, bytes);
    submit([dst = dev(dst), staged, bytes] { std::memcpy(dst, staged.get(), bytes); });
  }
  void copy_out(void* dst, const void* src, size_t bytes) override {
    if (arena_.contains(dst)) throw std::logic_error("strict device: copy_out into device memory (use copy)");
    ++g_copies_out;
    std::memset(dst, 0xFF, bytes);  // poison until synchronize(): NaN as floats, -1 as integers
    submit([dst, src = dev(src), bytes] { std::memcpy(dst, src, bytes); });
  }
  void synchronize() override { queue_.synchronize(); }

  // ---- results the host waits for ----
  bool matmul16_available(DType t) override { return cpu_.matmul16_available(t); }
  // [i29: native16] The CPU backend's 16-bit-native kernels, queued on device memory.
  bool native16_available(DType t) override { return cpu_.native16_available(t); }
  void embedding_forward16(void* out, DType t, const int32_t* tokens, const void* wte, const void* wpe, int B, int T, int C) override {
    submit([this, out = dev(out), t, tokens = dev(tokens), wte = dev(wte), wpe = dev(wpe), B, T, C] { cpu_.embedding_forward16(out, t, tokens, wte, wpe, B, T, C); });
  }
  void embedding_backward16(float* dwte, float* dwpe, const void* dout, DType t, const int32_t* tokens, int B, int T, int C) override {
    submit([this, dwte = dev(dwte), dwpe = dev(dwpe), dout = dev(dout), t, tokens = dev(tokens), B, T, C] { cpu_.embedding_backward16(dwte, dwpe, dout, t, tokens, B, T, C); });
  }
  void layernorm_forward16(void* out, float* mean, float* rstd, const void* inp, const float* weight, const float* bias, DType t, int N, int C, float eps) override {
    submit([this, out = dev(out), mean = dev(mean), rstd = dev(rstd), inp = dev(inp), weight = dev(weight), bias = dev(bias), t, N, C, eps] { cpu_.layernorm_forward16(out, mean, rstd, inp, weight, bias, t, N, C, eps); });
  }
  void layernorm_backward16(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const float* weight, const float* mean, const float* rstd, DType t, int N, int C) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dbias = dev(dbias), dout = dev(dout), inp = dev(inp), weight = dev(weight), mean = dev(mean), rstd = dev(rstd), t, N, C] { cpu_.layernorm_backward16(dinp, dweight, dbias, dout, inp, weight, mean, rstd, t, N, C); });
  }
  void rmsnorm_forward16(void* out, float* rstd, const void* inp, const float* weight, DType t, int N, int C, float eps) override {
    submit([this, out = dev(out), rstd = dev(rstd), inp = dev(inp), weight = dev(weight), t, N, C, eps] { cpu_.rmsnorm_forward16(out, rstd, inp, weight, t, N, C, eps); });
  }
  void rmsnorm_backward16(void* dinp, float* dweight, const void* dout, const void* inp, const float* weight, const float* rstd, DType t, int N, int C) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dout = dev(dout), inp = dev(inp), weight = dev(weight), rstd = dev(rstd), t, N, C] { cpu_.rmsnorm_backward16(dinp, dweight, dout, inp, weight, rstd, t, N, C); });
  }
  void rope_forward16(void* out, const void* inp, DType t, int B, int T, int C, Heads heads, float theta) override {
    submit([this, out = dev(out), inp = dev(inp), t, B, T, C, heads, theta] { cpu_.rope_forward16(out, inp, t, B, T, C, heads, theta); });
  }
  void rope_backward16(void* dinp, const void* dout, DType t, int B, int T, int C, Heads heads, float theta) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), t, B, T, C, heads, theta] { cpu_.rope_backward16(dinp, dout, t, B, T, C, heads, theta); });
  }
  void gelu_forward16(void* out, const void* inp, DType t, int64_t n) override {
    submit([this, out = dev(out), inp = dev(inp), t, n] { cpu_.gelu_forward16(out, inp, t, n); });
  }
  void gelu_backward16(void* dinp, const void* inp, const void* dout, DType t, int64_t n) override {
    submit([this, dinp = dev(dinp), inp = dev(inp), dout = dev(dout), t, n] { cpu_.gelu_backward16(dinp, inp, dout, t, n); });
  }
  void swiglu_forward16(void* out, const void* inp, DType t, int N, int H) override {
    submit([this, out = dev(out), inp = dev(inp), t, N, H] { cpu_.swiglu_forward16(out, inp, t, N, H); });
  }
  void swiglu_backward16(void* dinp, const void* dout, const void* inp, DType t, int N, int H) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), inp = dev(inp), t, N, H] { cpu_.swiglu_backward16(dinp, dout, inp, t, N, H); });
  }
  void add_forward16(void* out, const void* a, const void* b, DType t, int64_t n) override {
    submit([this, out = dev(out), a = dev(a), b = dev(b), t, n] { cpu_.add_forward16(out, a, b, t, n); });
  }
  void add_inplace16(void* dst, const void* src, DType t, int64_t n) override {
    submit([this, dst = dev(dst), src = dev(src), t, n] { cpu_.add_inplace16(dst, src, t, n); });
  }
  void dropout_forward16(void* out, const void* inp, DType t, int64_t n, DropoutSpec drop) override {
    submit([this, out = dev(out), inp = dev(inp), t, n, drop] { cpu_.dropout_forward16(out, inp, t, n, drop); });
  }
  void dropout_backward16(void* dinp, const void* dout, DType t, int64_t n, DropoutSpec drop) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), t, n, drop] { cpu_.dropout_backward16(dinp, dout, t, n, drop); });
  }
  void attention_forward16(void* out, float* lse, const void* qkv, DType t, int B, int T, int C, Heads heads, DropoutSpec drop) override {
    submit([this, out = dev(out), lse = dev(lse), qkv = dev(qkv), t, B, T, C, heads, drop] { cpu_.attention_forward16(out, lse, qkv, t, B, T, C, heads, drop); });
  }
  void attention_backward16(void* dqkv, const void* dout, const void* qkv, const float* lse, DType t, int B, int T, int C, Heads heads, DropoutSpec drop, float* work) override {
    submit([this, dqkv = dev(dqkv), dout = dev(dout), qkv = dev(qkv), lse = dev(lse), t, B, T, C, heads, drop, work = dev(work)] { cpu_.attention_backward16(dqkv, dout, qkv, lse, t, B, T, C, heads, drop, work); });
  }
  double sum_squares(const float* x, int64_t n) override {
    double r = 0;
    submit([this, &r, x = dev(x), n] { r = cpu_.sum_squares(x, n); });
    synchronize();
    return r;
  }
  double sum_squares_typed(const void* x, DType t, int64_t n) override {
    double r = 0;
    submit([this, &r, x = dev(x), t, n] { r = cpu_.sum_squares_typed(x, t, n); });
    synchronize();
    return r;
  }

  // ---- kernels: the CPU backend's, queued, on translated pointers ----
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) override {
    submit([this, dst = dev(dst), dt, src = dev(src), st, n] { cpu_.convert(dst, dt, src, st, n); });
  }
  void accumulate(void* dst, DType dt, const float* src, int64_t n) override {
    submit([this, dst = dev(dst), dt, src = dev(src), n] { cpu_.accumulate(dst, dt, src, n); });
  }
  void fill(void* x, DType t, float v, int64_t n) override {
    submit([this, x = dev(x), t, v, n] { cpu_.fill(x, t, v, n); });
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) override {
    submit([this, out = dev(out), tokens = dev(tokens), wte = dev(wte), wpe = dev(wpe), B, T, C] { cpu_.embedding_forward(out, tokens, wte, wpe, B, T, C); });
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) override {
    submit([this, dwte = dev(dwte), dwpe = dev(dwpe), dout = dev(dout), tokens = dev(tokens), B, T, C] { cpu_.embedding_backward(dwte, dwpe, dout, tokens, B, T, C); });
  }
  void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C, int vstart, int Vlocal) override {
    submit([this, out = dev(out), tokens = dev(tokens), wte = dev(wte), wpe = dev(wpe), B, T, C, vstart, Vlocal] { cpu_.embedding_shard_forward(out, tokens, wte, wpe, B, T, C, vstart, Vlocal); });
  }
  void embedding_shard_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C, int vstart, int Vlocal) override {
    submit([this, dwte = dev(dwte), dwpe = dev(dwpe), dout = dev(dout), tokens = dev(tokens), B, T, C, vstart, Vlocal] { cpu_.embedding_shard_backward(dwte, dwpe, dout, tokens, B, T, C, vstart, Vlocal); });
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int N, int C, float eps) override {
    submit([this, out = dev(out), mean = dev(mean), rstd = dev(rstd), inp = dev(inp), weight = dev(weight), bias = dev(bias), N, C, eps] { cpu_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps); });
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dbias = dev(dbias), dout = dev(dout), inp = dev(inp), weight = dev(weight), mean = dev(mean), rstd = dev(rstd), N, C] { cpu_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) override {
    submit([this, out = dev(out), rstd = dev(rstd), inp = dev(inp), weight = dev(weight), N, C, eps] { cpu_.rmsnorm_forward(out, rstd, inp, weight, N, C, eps); });
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight, const float* rstd, int N, int C) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dout = dev(dout), inp = dev(inp), weight = dev(weight), rstd = dev(rstd), N, C] { cpu_.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, C); });
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC) override {
    submit([this, out = dev(out), inp = dev(inp), weight = dev(weight), bias = dev(bias), N, C, OC] { cpu_.matmul_forward(out, inp, weight, bias, N, C, OC); });
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, int N, int C, int OC) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dbias = dev(dbias), dout = dev(dout), inp = dev(inp), weight = dev(weight), N, C, OC] { cpu_.matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
  }
  void matmul16_forward(float* out, const void* inp, const void* weight, const void* bias, DType t, int N, int C, int OC) override {
    submit([this, out = dev(out), inp = dev(inp), weight = dev(weight), bias = dev(bias), t, N, C, OC] { cpu_.matmul16_forward(out, inp, weight, bias, t, N, C, OC); });
  }
  void matmul16_backward(float* dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight, DType t, int N, int C, int OC) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dbias = dev(dbias), dout = dev(dout), inp = dev(inp), weight = dev(weight), t, N, C, OC] { cpu_.matmul16_backward(dinp, dweight, dbias, dout, inp, weight, t, N, C, OC); });
  }
  void rope_forward(float* out, const float* inp, int B, int T, int C, Heads heads, float theta) override {
    submit([this, out = dev(out), inp = dev(inp), B, T, C, heads, theta] { cpu_.rope_forward(out, inp, B, T, C, heads, theta); });
  }
  void rope_backward(float* dinp, const float* dout, int B, int T, int C, Heads heads, float theta) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), B, T, C, heads, theta] { cpu_.rope_backward(dinp, dout, B, T, C, heads, theta); });
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads heads, DropoutSpec drop) override {
    submit([this, out = dev(out), lse = dev(lse), qkv = dev(qkv), B, T, C, heads, drop] { cpu_.attention_forward(out, lse, qkv, B, T, C, heads, drop); });
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C, Heads heads, DropoutSpec drop, float* work) override {
    submit([this, dqkv = dev(dqkv), dout = dev(dout), qkv = dev(qkv), lse = dev(lse), B, T, C, heads, drop, work = dev(work)] { cpu_.attention_backward(dqkv, dout, qkv, lse, B, T, C, heads, drop, work); });
  }
  void kv_cache_write(KvView kv, const float* qkv, int B, int T, int C, Heads heads) override {
    submit([this, kv = dev_kv(kv), qkv = dev(qkv), B, T, C, heads] { cpu_.kv_cache_write(kv, qkv, B, T, C, heads); });
  }
  void attention_decode(float* out, const float* qkv, KvView kv, const int32_t* pos, int B, int C, Heads heads, float theta) override {
    submit([this, out = dev(out), qkv = dev(qkv), kv = dev_kv(kv), pos = dev(pos), B, C, heads, theta] { cpu_.attention_decode(out, qkv, kv, pos, B, C, heads, theta); });
  }
  void gelu_forward(float* out, const float* inp, int64_t n) override {
    submit([this, out = dev(out), inp = dev(inp), n] { cpu_.gelu_forward(out, inp, n); });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    submit([this, dinp = dev(dinp), inp = dev(inp), dout = dev(dout), n] { cpu_.gelu_backward(dinp, inp, dout, n); });
  }
  // [i29: fused]
  void linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias, int N, int C, int OC) override {
    submit([this, out = dev(out), pre = dev(pre), inp = dev(inp), weight = dev(weight), bias = dev(bias), N, C, OC] { cpu_.linear_gelu_forward(out, pre, inp, weight, bias, N, C, OC); });
  }
  void linear_gelu_backward(float* dinp, float* dweight, float* dbias, float* dpre, const float* pre, const float* inp, const float* weight, int N, int C, int OC) override {
    submit([this, dinp = dev(dinp), dweight = dev(dweight), dbias = dev(dbias), dpre = dev(dpre), pre = dev(pre), inp = dev(inp), weight = dev(weight), N, C, OC] { cpu_.linear_gelu_backward(dinp, dweight, dbias, dpre, pre, inp, weight, N, C, OC); });
  }
  void add_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* a, const void* b, const float* weight, const float* bias, DType t, int N, int C, float eps) override {
    submit([this, sum = dev(sum), out = dev(out), mean = dev(mean), rstd = dev(rstd), a = dev(a), b = dev(b), weight = dev(weight), bias = dev(bias), t, N, C, eps] { cpu_.add_layernorm_forward(sum, out, mean, rstd, a, b, weight, bias, t, N, C, eps); });
  }
  void add_layernorm_backward(void* da, void* db, float* dweight, float* dbias, void* dsum, const void* dout, const void* sum, const float* weight, const float* mean, const float* rstd, DType t, int N, int C) override {
    submit([this, da = dev(da), db = dev(db), dweight = dev(dweight), dbias = dev(dbias), dsum = dev(dsum), dout = dev(dout), sum = dev(sum), weight = dev(weight), mean = dev(mean), rstd = dev(rstd), t, N, C] { cpu_.add_layernorm_backward(da, db, dweight, dbias, dsum, dout, sum, weight, mean, rstd, t, N, C); });
  }
  void add_rmsnorm_forward(void* sum, void* out, float* rstd, const void* a, const void* b, const float* weight, DType t, int N, int C, float eps) override {
    submit([this, sum = dev(sum), out = dev(out), rstd = dev(rstd), a = dev(a), b = dev(b), weight = dev(weight), t, N, C, eps] { cpu_.add_rmsnorm_forward(sum, out, rstd, a, b, weight, t, N, C, eps); });
  }
  void add_rmsnorm_backward(void* da, void* db, float* dweight, void* dsum, const void* dout, const void* sum, const float* weight, const float* rstd, DType t, int N, int C) override {
    submit([this, da = dev(da), db = dev(db), dweight = dev(dweight), dsum = dev(dsum), dout = dev(dout), sum = dev(sum), weight = dev(weight), rstd = dev(rstd), t, N, C] { cpu_.add_rmsnorm_backward(da, db, dweight, dsum, dout, sum, weight, rstd, t, N, C); });
  }
  void swiglu_forward(float* out, const float* inp, int N, int H) override {
    submit([this, out = dev(out), inp = dev(inp), N, H] { cpu_.swiglu_forward(out, inp, N, H); });
  }
  void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), inp = dev(inp), N, H] { cpu_.swiglu_backward(dinp, dout, inp, N, H); });
  }
  void add_forward(float* out, const float* a, const float* b, int64_t n) override {
    submit([this, out = dev(out), a = dev(a), b = dev(b), n] { cpu_.add_forward(out, a, b, n); });
  }
  void add_inplace(float* dst, const float* src, int64_t n) override {
    submit([this, dst = dev(dst), src = dev(src), n] { cpu_.add_inplace(dst, src, n); });
  }
  void dropout_forward(float* out, const float* inp, int64_t n, DropoutSpec drop) override {
    submit([this, out = dev(out), inp = dev(inp), n, drop] { cpu_.dropout_forward(out, inp, n, drop); });
  }
  void dropout_backward(float* dinp, const float* dout, int64_t n, DropoutSpec drop) override {
    submit([this, dinp = dev(dinp), dout = dev(dout), n, drop] { cpu_.dropout_backward(dinp, dout, n, drop); });
  }
  void softmax_xent_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V, int Vreal) override {
    submit([this, losses = dev(losses), probs = dev(probs), logits = dev(logits), targets = dev(targets), N, V, Vreal] { cpu_.softmax_xent_forward(losses, probs, logits, targets, N, V, Vreal); });
  }
  void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V, int Vreal) override {
    submit([this, dlogits = dev(dlogits), probs = dev(probs), targets = dev(targets), dloss, N, V, Vreal] { cpu_.softmax_xent_backward(dlogits, probs, targets, dloss, N, V, Vreal); });
  }
  void xent_shard_max(float* rowmax, const float* logits, int N, int V, int Vreal) override {
    submit([this, rowmax = dev(rowmax), logits = dev(logits), N, V, Vreal] { cpu_.xent_shard_max(rowmax, logits, N, V, Vreal); });
  }
  void xent_shard_sumexp(float* sumexp, float* tlogit, const float* logits, const float* rowmax, const int32_t* targets, int N, int V, int Vreal, int vstart) override {
    submit([this, sumexp = dev(sumexp), tlogit = dev(tlogit), logits = dev(logits), rowmax = dev(rowmax), targets = dev(targets), N, V, Vreal, vstart] { cpu_.xent_shard_sumexp(sumexp, tlogit, logits, rowmax, targets, N, V, Vreal, vstart); });
  }
  void xent_shard_finish(float* losses, float* probs, const float* logits, const float* rowmax, const float* sumexp, const float* tlogit, const int32_t* targets, int N, int V, int Vreal) override {
    submit([this, losses = dev(losses), probs = dev(probs), logits = dev(logits), rowmax = dev(rowmax), sumexp = dev(sumexp), tlogit = dev(tlogit), targets = dev(targets), N, V, Vreal] { cpu_.xent_shard_finish(losses, probs, logits, rowmax, sumexp, tlogit, targets, N, V, Vreal); });
  }
  void xent_shard_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V, int Vreal, int vstart) override {
    submit([this, dlogits = dev(dlogits), probs = dev(probs), targets = dev(targets), dloss, N, V, Vreal, vstart] { cpu_.xent_shard_backward(dlogits, probs, targets, dloss, N, V, Vreal, vstart); });
  }
  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t, float grad_scale) override {
    submit([this, param = dev(param), grad = dev(grad), m = dev(m), v = dev(v), n, lr, beta1, beta2, eps, weight_decay, t, grad_scale] { cpu_.adamw_update(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale); });
  }
  void scale(float* x, int64_t n, float s) override {
    submit([this, x = dev(x), n, s] { cpu_.scale(x, n, s); });
  }
  // [i26: ops step path]
  void adamw_update_typed(void* param, DType pt, const void* grad, DType gt, float* master, float* m, float* v,
                          int64_t n, const AdamwArgs& a) override {
    submit([this, param = dev(param), pt, grad = dev(grad), gt, master = dev(master), m = dev(m), v = dev(v), n, a] {
      cpu_.adamw_update_typed(param, pt, grad, gt, master, m, v, n, a);
    });
  }
  // [i29: optimizer]
  void adamw_update_zero_grad(void* param, DType pt, void* grad, DType gt, float* master, float* m, float* v,
                              int64_t n, const AdamwArgs& a) override {
    submit([this, param = dev(param), pt, grad = dev(grad), gt, master = dev(master), m = dev(m), v = dev(v), n, a] {
      cpu_.adamw_update_zero_grad(param, pt, grad, gt, master, m, v, n, a);
    });
  }
  // [i26: parallel]
  // [i26: train and checkpoint]
  // The strict device has one queue, so the "side queue" is that queue: a staged copy is
  // ordered after the kernels before it and before the ones after it, as on CUDA. Its
  // destination is poisoned until stage_wait, and a fence is a marker on the queue whose
  // waiter is released when the marker runs or is dropped (a failed kernel drops the rest of
  // the queue until synchronize(): the wait then throws instead of hanging).
  void stage_out(void* dst, const void* src, size_t bytes) override {
    if (arena_.contains(dst)) throw std::logic_error("strict device: stage_out into device memory (use copy)");
    ++g_copies_out;
    std::memset(dst, 0xFF, bytes);  // poison until stage_wait
    submit([dst, src = dev(src), bytes] { std::memcpy(dst, src, bytes); });
  }
  uint64_t stage_fence() override {
    auto f = std::make_shared<Fence>();
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(fence_mu_);
      id = ++fence_next_;
      fences_[id] = f;
    }
    auto token = std::make_shared<FenceToken>(f);
    submit([token] { token->ran = true; });
    return id;
  }
  void stage_wait(uint64_t fence) override {
    std::shared_ptr<Fence> f;
    {
      std::lock_guard<std::mutex> lock(fence_mu_);
      auto it = fences_.find(fence);
      if (it == fences_.end()) throw std::logic_error("strict device: stage_wait of an unknown fence (each is waited for once)");
      f = it->second;
      fences_.erase(it);
    }
    std::unique_lock<std::mutex> lock(f->mu);
    f->cv.wait(lock, [&] { return f->done; });
    if (!f->ran)
      throw std::runtime_error("strict device: the staged copies did not run (a queued call failed before them; "
                               "synchronize() reports it)");
  }
  // [i26: generate and export]
  // [i26: attention]

 private:
  template <class T> T* dev(T* p) const { return arena_.kernel(p); }
  KvView dev_kv(KvView kv) const {
    kv.k = dev(kv.k);
    kv.v = dev(kv.v);
    kv.k_scale = dev(kv.k_scale);
    kv.v_scale = dev(kv.v_scale);
    return kv;
  }
  void submit(std::function<void()> f) { queue_.submit(std::move(f)); }
  // [i26: train and checkpoint] a stage fence: released when its marker runs, or is dropped.
  struct Fence {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, ran = false;
  };
  struct FenceToken {
    explicit FenceToken(std::shared_ptr<Fence> f) : fence(std::move(f)) {}
    ~FenceToken() {
      std::lock_guard<std::mutex> lock(fence->mu);
      fence->done = true;
      fence->ran = ran;
      fence->cv.notify_all();
    }
    std::shared_ptr<Fence> fence;
    bool ran = false;
  };
  std::mutex fence_mu_;
  std::map<uint64_t, std::shared_ptr<Fence>> fences_;
  uint64_t fence_next_ = 0;

  Backend& cpu_;
  Arena arena_;
  Queue queue_;  // last: its thread stops (running what is queued) before the arena goes
};

StrictBackend* g_backend = nullptr;

// A host access to device memory is a SIGSEGV at an address in the PROT_NONE view: say so and
// where (a backtrace), then die of the signal as before (the debugger and the core see the line).
struct sigaction g_previous_segv;
void on_segv(int sig, siginfo_t* info, void* ctx) {
  Arena* a = g_arena.load();
  if (a && a->contains(info->si_addr)) {
    static const char msg[] =
        "\nstrict device: host code touched device memory (a tensor's storage read or written outside a backend "
        "call: use a kernel, or a named crossing such as Tensor::read_to_host). Backtrace:\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    void* frames[48];
    const int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);  // the previous handler (or the default) takes it from here
  raise(sig);
}

}  // namespace

Backend& strict_backend() {
  static StrictBackend* b = [] {
    g_backend = new StrictBackend();  // never destroyed: tensors may outlive static destructors
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous_segv);
    return g_backend;
  }();
  return *b;
}

bool is_device_pointer(const void* p) {
  Arena* a = g_arena.load();
  return a && a->contains(p);
}

StrictStats strict_stats() {
  StrictStats s;
  Arena* a = g_arena.load();
  if (!a) return s;
  s.queued = g_queued.load();
  s.copies_in = g_copies_in.load();
  s.copies_out = g_copies_out.load();
  s.bytes_in_use = a->in_use();
  s.arena_top = a->top();
  return s;
}

}  // namespace ops::strict
