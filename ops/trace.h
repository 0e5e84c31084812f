// A layer-neutral sink for timeline spans (Chrome trace events when the run is profiled): the
// communicators (parallel/comm.cpp), the pipeline runner and the training loop report what
// they did and when to a TraceSink; runner/ decides how it is written. ops/ and parallel/ see
// only this interface. A null sink (the default everywhere) records nothing, so when
// profiling is off the cost is one pointer test per call.
//
// Spans are either synchronous (the caller was inside them from t0 to t1: a blocking
// collective, a data wait, the optimizer step) or asynchronous (a non-blocking collective or
// send: launched at t0, seen complete at t1 while the caller computed; its time is hidden
// behind compute, which Perfetto shows as a separate track).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace ops {

struct TraceSpan {
  std::string name;        // "allreduce", "isend", "data wait", ...
  const char* cat = "";    // "comm" | "p2p" | "data" | "optimizer" | "checkpoint" | "pipeline" | ...
  const char* group = "";  // the communicator's name ("dp", "tp", "world", "embed"); "" outside communication
  int64_t t0_ns = 0, t1_ns = 0;  // steady clock
  int64_t bytes = -1;      // payload bytes (-1: not a transfer)
  int peer = -1;           // point-to-point: the other rank (in `group`'s numbering)
  int tag = -1;            // point-to-point: the message tag
  int micro = -1;          // the micro-batch it belongs to (-1: none)
  bool async = false;      // launched non-blocking: overlapped with whatever ran between t0 and t1
  int64_t wait_ns = 0;     // async: of t1 - t0, the time the caller spent waiting for it (exposed)
  int64_t mark = -1;       // the sink's mark() when the span began (-1: none)
};

class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void span(const TraceSpan& s) = 0;
  // Where the caller is when a span begins (the trainer: which profiled step), stamped on the
  // span, so a non-blocking one seen complete later is filed where it began.
  virtual int64_t mark() { return -1; }
};

inline int64_t trace_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ops
