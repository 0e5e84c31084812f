// The device timer's registry and the executor's per-node event log (see device_timer.h).
#include "ops/device_timer.h"

#include <atomic>

namespace ops {

namespace {
std::atomic<DeviceTimer*> g_timer{nullptr};
}  // namespace

DeviceTimer* device_timer() { return g_timer.load(std::memory_order_relaxed); }
void set_device_timer(DeviceTimer* t) { g_timer.store(t); }

int64_t OpEventLog::begin(int kind, char pass, const char* op_name) {
  DeviceTimer* t = device_timer();
  if (!t) return -1;
  t->push_range(op_name, pass);
  pending_.push_back({kind, pass, t->record(), -1});
  return static_cast<int64_t>(pending_.size()) - 1;
}

bool OpEventLog::end(int64_t token) {
  if (token < 0) return false;
  DeviceTimer* t = device_timer();
  pending_[static_cast<size_t>(token)].b = t->record();
  t->pop_range();
  return true;
}

void OpEventLog::resolve(const std::function<void(int kind, char pass, double ms)>& add) {
  DeviceTimer* t = device_timer();
  if (!t || pending_.empty()) return;
  for (const Pending& p : pending_) {
    if (p.b >= 0) {
      add(p.kind, p.pass, t->elapsed_ms(p.a, p.b));
      t->release(p.b);
    }
    t->release(p.a);
  }
  pending_.clear();
}

}  // namespace ops
