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
  StrictBackend() : cpu_(cpu_backend()) {
    g_arena.store(&arena_);
    wrap_all(static_cast<k::AllKernels*>(nullptr));
  }
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

 private:
  template <class T> T* dev(T* p) const { return arena_.kernel(p); }
  // The kernel table: every entry of the CPU backend's, queued. The arguments are copied, each
  // pointer translated into the arena's kernel view (a host pointer is refused there, at the
  // call), and the CPU's entry runs on the queue; a kernel that returns a value to the host is
  // waited for. has() answers as the CPU's does (the same availability condition).
  template <class... K> void wrap_all(std::tuple<K...>*) { (wrap<K>(), ...); }
  template <class K> void wrap() {
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      const Entry* e = cpu_.entry(K::id, t);
      if (!e || !e->fn) continue;
      provide<K>(t, [this, t](const K& args) {
        K d = args;
        d.pointers([this](auto*& p) { p = dev(p); });
        submit([this, d, t] { cpu_.run(d, t); });
        if constexpr (K::kToHost) synchronize();
      }, e->available);
    }
  }
  void submit(std::function<void()> f) { queue_.submit(std::move(f)); }
  // A stage fence: released when its marker runs, or is dropped.
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
