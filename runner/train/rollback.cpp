// The in-memory rollback tier (rollback.h).
#include "runner/train/rollback.h"

#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runner/observe/step_timer.h"

namespace runner {

void Rollback::before_step(const TrainState& st) {
  if (cfg_.snapshot_every <= 0 || st.step % cfg_.snapshot_every != 0) return;
  if (snapshot_.valid() && snapshot_.step() == st.step) return;
  const int64_t t = StepTimer::now();
  snapshot_.take(st);
  ms_ += StepTimer::since(t);
}

bool Rollback::after_step(const StepResult& s, TrainState& st) {
  const int64_t t = StepTimer::now();
  // An fp16 overflow is the loss scaler's to handle (skipped, scale backed off), not a rollback.
  const bool bad = !std::isfinite(s.loss) || (!std::isfinite(s.norm) && !s.overflow);
  const bool spike = cfg_.spike_threshold > 0 && st.loss_ema > 0 && st.step > 10 && s.loss > cfg_.spike_threshold * st.loss_ema;
  if (!bad && std::isfinite(s.loss)) st.loss_ema = st.loss_ema > 0 ? 0.9 * st.loss_ema + 0.1 * s.loss : s.loss;
  if (!(bad || spike) || !snapshot_.valid() || cfg_.snapshot_every <= 0) return false;
  const int64_t offending = st.step - 1;
  log_->warn("step {}: loss {:.4f} ({}); rolling back to the in-memory snapshot of step {} and skipping that batch",
             st.step, s.loss, bad ? "not finite" : fmt::format("{:.1f}x its running mean", s.loss / st.loss_ema),
             snapshot_.step());
  snapshot_.restore(st);
  loader_.restore(st.loader);
  skip_.insert(offending);
  metrics_.rollback(offending + 1, st.step, s.loss);
  ms_ += s.total_ms + StepTimer::since(t);  // the attempt is lost
  return true;
}

bool Rollback::skip_batch(int64_t step) {
  if (!skip_.erase(step)) return false;
  log_->warn("step {}: skipping the batch that caused the rollback", step + 1);
  return true;
}

}  // namespace runner
