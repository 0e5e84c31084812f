// The slow-step warning (slow_steps.h).
#include "runner/observe/slow_steps.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "ops/backend.h"

namespace runner {

MachineLoad live_machine() {
  MachineLoad m;
  std::ifstream f("/proc/loadavg");
  if (!(f >> m.load1)) m.load1 = -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  m.cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  m.threads = ops::num_threads();
  if (const char* w = std::getenv("OMP_WAIT_POLICY")) m.wait_policy = w;
  return m;
}

std::string SlowStepCheck::message(double mean_s, const MachineLoad& m) const {
  std::string msg = fmt::format("steps run {:.1f}x slower than planned ({:.3g} s against a predicted {:.3g} s, {} steps in a row)",
                                mean_s / predicted_s_, mean_s, predicted_s_, kSteps);
  // Our own threads count in the load while they run: what is left is the others' demand.
  const double others = m.load1 < 0 ? -1 : std::max(0.0, m.load1 - m.threads);
  const bool busy = others >= 0.5 * m.cores;
  std::string policy = m.wait_policy;
  std::transform(policy.begin(), policy.end(), policy.begin(), [](unsigned char c) { return std::tolower(c); });
  if (m.load1 < 0) {
    msg += fmt::format("; the machine's load is unknown (no /proc/loadavg); this rank runs {} OpenMP thread(s) on {} "
                       "core(s)", m.threads, m.cores);
  } else if (busy && m.threads <= 1) {
    msg += fmt::format("; the likely cause: the machine is busy (load average {:.1f} on {} core(s), /proc/loadavg); this rank "
                       "runs one OpenMP thread already, so the other load is what slows it: run it where cores are free, "
                       "or with fewer ranks on this machine", m.load1, m.cores);
  } else if (busy) {
    const int free_cores = std::max(1, static_cast<int>(std::floor(m.cores - others)));
    msg += fmt::format("; the likely cause: the machine is busy (load average {:.1f} on {} core(s), /proc/loadavg) and this "
                       "rank's {} OpenMP thread(s) compete with that load. Fix: --set train.threads={} (the cores left "
                       "free){}", m.load1, m.cores, m.threads, free_cores,
                       policy == "active" ? ", and unset OMP_WAIT_POLICY=active (spinning threads fight other processes)"
                                          : "");
  } else {
    msg += fmt::format("; the machine is not busy (load average {:.1f} on {} core(s)), so the prediction may be off for "
                       "this CPU: `runner calibrate` measures it", m.load1, m.cores);
  }
  return msg;
}

}  // namespace runner
