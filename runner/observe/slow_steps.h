// A run far slower than its plan says so, once, with the likely cause and the fix.
//
// On a shared machine the default thread count (every core) meets other load: OpenMP threads
// that spin while they wait take cores from the processes beside them and lose theirs in turn,
// and steps took 12-48x the plan's prediction without a word. The check compares each measured
// step with the predicted one; when several steps in a row run more than `factor` times slower,
// it reads the machine's load (/proc/loadavg) and names what to change: fewer threads (the
// cores left free), passive waiting, or, on an idle machine, the prediction itself.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace runner {

// What the warning says about the machine: gathered when it fires (live_machine()).
struct MachineLoad {
  double load1 = -1;        // /proc/loadavg's 1-minute figure (-1 unknown)
  int cores = 1;            // the cores this process may run on
  int threads = 1;          // this rank's OpenMP threads
  std::string wait_policy;  // OMP_WAIT_POLICY as set ("" unset)
};
MachineLoad live_machine();

class SlowStepCheck {
 public:
  static constexpr double kFactor = 3.0;  // measured over predicted
  static constexpr int kSteps = 5;        // in a row, after the warm-up
  static constexpr int kWarmup = 2;       // the first steps (allocation, caches) are not judged

  explicit SlowStepCheck(double predicted_step_s) : predicted_s_(predicted_step_s) {}
  // After each step: the warning when it first holds (then never again), else nullopt. `machine`
  // is asked only then.
  template <class Machine>
  std::optional<std::string> step(double measured_s, Machine&& machine) {
    if (warned_ || predicted_s_ <= 0 || ++seen_ <= kWarmup) return std::nullopt;
    if (measured_s <= kFactor * predicted_s_) {
      run_ = 0;
      sum_s_ = 0;
      return std::nullopt;
    }
    sum_s_ += measured_s;
    if (++run_ < kSteps) return std::nullopt;
    warned_ = true;
    return message(sum_s_ / run_, machine());
  }
  // The warning for steps of `mean_s` against the prediction, on `m`.
  std::string message(double mean_s, const MachineLoad& m) const;

 private:
  double predicted_s_;
  int64_t seen_ = 0;
  int run_ = 0;
  double sum_s_ = 0;
  bool warned_ = false;
};

}  // namespace runner
