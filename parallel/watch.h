// What this process's communicating thread is blocked on right now, for the watchdog
// (runner/train/watchdog.h).
//
// The communicators mark every blocking MPI call (allreduce, broadcast, send, recv, barrier,
// allgather) and every wait on a non-blocking one (Request::wait, and an unfinished request's
// destructor) with the operation, the group (its name and its members' world ranks), the peer
// of a point-to-point message, the bytes, when the wait began and the group's sequence number
// of the call. The watchdog thread reads it to decide that a wait has lasted too long and to
// tell which members did not arrive.
//
// Cost. Only one thread calls MPI (MPI_THREAD_FUNNELED), so there is a single slot, written
// with relaxed atomic stores under a sequence counter (a seqlock): no lock, no allocation, a
// clock read per call. The watchdog reads it at its own pace and retries a read that raced a
// write. Until watch_enable(true) (the trainer's watchdog starts), marking is one relaxed load.
#pragma once
#include <cstdint>

#include "parallel/comm.h"

namespace parallel {

// A communicator's members as world ranks: first + i * stride for i < size (the groups of the
// Grid are all arithmetic progressions; an irregular group has stride 0 and only its size).
struct GroupRanks {
  int first = 0, stride = 1, size = 1;
  int world_rank(int i) const { return stride == 0 ? -1 : first + i * stride; }
};

// One wait, as the watchdog sees it.
struct WaitInfo {
  bool active = false;
  CommOp op = CommOp::Count;
  const char* group = "";  // the communicator's name ("world", "dp", "tp", "pp", "embed")
  GroupRanks ranks;
  int peer = -1;          // point-to-point: the peer's world rank (-1: a collective)
  int64_t bytes = 0;
  int64_t since_ns = 0;   // watch_now_ns() when the wait began
  int64_t seq = 0;        // the call's number among the group's collectives (1-based)
};

// Marking on or off (off by default: a process without a watchdog pays one load per call).
void watch_enable(bool on);
bool watch_enabled();
// The steady clock the marks use, in nanoseconds.
int64_t watch_now_ns();
// What this process waits on now (active false: nothing). Safe from any thread.
WaitInfo watch_current();

// The comm layer's marks (the communicating thread only). Nested marks keep the outer one.
void watch_begin(const WaitInfo& w);
void watch_end();

// Marks the scope of one blocking wait.
class WaitMark {
 public:
  explicit WaitMark(const WaitInfo& w) : on_(watch_enabled()) {
    if (on_) watch_begin(w);
  }
  ~WaitMark() {
    if (on_) watch_end();
  }
  WaitMark(const WaitMark&) = delete;
  WaitMark& operator=(const WaitMark&) = delete;

 private:
  bool on_;
};

}  // namespace parallel
