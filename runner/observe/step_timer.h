// The step's stopwatch: one clock (ops::trace_now_ns, the steady clock in nanoseconds) for both
// the coarse breakdown (StepResult's milliseconds) and the profiled step's trace spans. Each
// phase reads the clock once at its end and feeds both, so the breakdown and the trace can
// never disagree about where a phase began or ended. Outside a profiled step the sink is null
// and a phase costs one clock read.
#pragma once
#include <cstdint>

#include "ops/device_timer.h"
#include "ops/trace.h"

namespace runner {

class StepTimer {
 public:
  // On a GPU (a device timer installed) the clock is read after the device's queue drained
  // (an event on the compute stream, waited for), so a phase holds the device's work, not
  // the host's launches; on the CPU it is the plain steady clock.
  static int64_t now() { return ops::device_synced_now_ns(); }
  static double ms(int64_t t0, int64_t t1) { return static_cast<double>(t1 - t0) / 1e6; }
  static double since(int64_t t0) { return ms(t0, now()); }

  // Where spans go while the tracer records a profiled step (runner/observe/trace.h); null: nowhere.
  void trace_to(ops::TraceSink* sink) { sink_ = sink; }

  // The phase from t0 to now: its milliseconds, and a span of the trace when one is recorded.
  double phase(const char* name, const char* cat, int64_t t0) { return span(name, cat, t0, now()); }
  double span(const char* name, const char* cat, int64_t t0, int64_t t1) {
    if (sink_) {
      ops::TraceSpan s;
      s.name = name;
      s.cat = cat;
      s.t0_ns = t0;
      s.t1_ns = t1;
      sink_->span(s);
    }
    return ms(t0, t1);
  }

 private:
  ops::TraceSink* sink_ = nullptr;
};

}  // namespace runner
