// Timing on the device's queue. On a GPU a kernel call returns
// when it is queued, so a host clock around an operator measures its launch, not its work. A
// device with an asynchronous queue installs a DeviceTimer (runner/device/device.cpp: the CUDA
// backend's, events on the compute stream and NVTX ranges); the executor then times each node
// with two marks on the queue, resolved after the step (OpEventLog), and the step's
// breakdown reads a clock synchronised with the queue (device_synced_now_ns). Without one
// (the CPU, the strict device) nothing changes: host clocks, as before. The same object reports
// the device's own memory figures for the monitor (Memory).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/trace.h"

namespace ops {

class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // A mark on the queue after everything queued so far; its id.
  virtual int64_t record() = 0;
  // Milliseconds between marks a and b on the device (waits until b has happened).
  virtual double elapsed_ms(int64_t a, int64_t b) = 0;
  // Returns a mark's resources once its time was read.
  virtual void release(int64_t mark) = 0;
  // Waits until everything queued so far has run.
  virtual void wait() = 0;
  // A range named like the operator for an attached profiler (NVTX on CUDA): "linear",
  // "linear backward", "linear recompute".
  virtual void push_range(const char* op, char pass) = 0;
  virtual void pop_range() = 0;

  // The device's own view of its memory, to cross-check the ledger's accounts (which count
  // what tensors hold): its allocator's bytes in use and reserved (cached), and the driver's
  // used and total (cudaMemGetInfo on CUDA).
  struct Memory {
    size_t pool_used = 0, pool_reserved = 0, driver_used = 0, total = 0;
  };
  virtual Memory memory() = 0;
};

// This process's device timer (null: host clocks). Set once, when the backend is chosen.
DeviceTimer* device_timer();
void set_device_timer(DeviceTimer* t);

// The steady clock after the device's queue has drained (the plain clock without a device
// timer): a phase boundary read with it bounds the device's work, not the host's launches.
inline int64_t device_synced_now_ns() {
  if (DeviceTimer* t = device_timer()) t->wait();
  return trace_now_ns();
}

// The executor's per-node device times: begin/end around a node queue two marks (and an NVTX
// range); resolve() reads them after the work ran and hands (kind, pass, ms) to the table.
class OpEventLog {
 public:
  // Without a device timer: -1, and end() says the host clock stands.
  int64_t begin(int kind, char pass, const char* op_name);
  // True when the device timed the node (the host's milliseconds are not added then).
  bool end(int64_t token);
  void resolve(const std::function<void(int kind, char pass, double ms)>& add);
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    int kind;
    char pass;
    int64_t a, b;
  };
  std::vector<Pending> pending_;
};

}  // namespace ops
