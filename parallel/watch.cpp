// The wait slot the watchdog reads (watch.h): one seqlock-guarded set of atomics, written by
// the thread that calls MPI and read by the watchdog's thread.
#include "parallel/watch.h"

#include <atomic>
#include <chrono>

namespace parallel {

namespace {

struct Slot {
  std::atomic<bool> enabled{false};
  std::atomic<uint64_t> gen{0};  // odd while a write is in progress
  int depth = 0;                 // the writer's own nesting (the writer thread only)
  std::atomic<bool> active{false};
  std::atomic<int> op{0}, first{0}, stride{1}, size{1}, peer{-1};
  std::atomic<const char*> group{""};
  std::atomic<int64_t> bytes{0}, since{0}, seq{0};
};

Slot g_slot;

void publish(const WaitInfo& w, bool active) {
  Slot& s = g_slot;
  const uint64_t g = s.gen.load(std::memory_order_relaxed);
  s.gen.store(g + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.active.store(active, std::memory_order_relaxed);
  if (active) {
    s.op.store(static_cast<int>(w.op), std::memory_order_relaxed);
    s.group.store(w.group, std::memory_order_relaxed);
    s.first.store(w.ranks.first, std::memory_order_relaxed);
    s.stride.store(w.ranks.stride, std::memory_order_relaxed);
    s.size.store(w.ranks.size, std::memory_order_relaxed);
    s.peer.store(w.peer, std::memory_order_relaxed);
    s.bytes.store(w.bytes, std::memory_order_relaxed);
    s.since.store(w.since_ns, std::memory_order_relaxed);
    s.seq.store(w.seq, std::memory_order_relaxed);
  }
  s.gen.store(g + 2, std::memory_order_release);
}

}  // namespace

void watch_enable(bool on) { g_slot.enabled.store(on, std::memory_order_relaxed); }
bool watch_enabled() { return g_slot.enabled.load(std::memory_order_relaxed); }

int64_t watch_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void watch_begin(const WaitInfo& w) {
  if (g_slot.depth++ > 0) return;
  WaitInfo m = w;
  m.since_ns = watch_now_ns();
  publish(m, true);
}

void watch_end() {
  if (g_slot.depth == 0 || --g_slot.depth > 0) return;
  publish(WaitInfo{}, false);
}

WaitInfo watch_current() {
  const Slot& s = g_slot;
  for (;;) {
    const uint64_t g0 = s.gen.load(std::memory_order_acquire);
    if (g0 & 1) continue;  // a write in progress: it is a handful of stores
    WaitInfo w;
    w.active = s.active.load(std::memory_order_relaxed);
    w.op = static_cast<CommOp>(s.op.load(std::memory_order_relaxed));
    w.group = s.group.load(std::memory_order_relaxed);
    w.ranks = {s.first.load(std::memory_order_relaxed), s.stride.load(std::memory_order_relaxed),
               s.size.load(std::memory_order_relaxed)};
    w.peer = s.peer.load(std::memory_order_relaxed);
    w.bytes = s.bytes.load(std::memory_order_relaxed);
    w.since_ns = s.since.load(std::memory_order_relaxed);
    w.seq = s.seq.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.gen.load(std::memory_order_relaxed) == g0) return w;
  }
}

}  // namespace parallel
