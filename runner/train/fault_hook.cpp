// The fault hook's faults; see fault_hook.h for what each one stands for.
#include "runner/train/fault_hook.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "ops/convert.h"
#include "runner/checkpoint/checkpoint.h"

namespace runner {

namespace {

// Element i := v in t's dtype, written through the crossing in (t may be device memory).
void set_element(ops::Tensor& t, int64_t i, float v) {
  uint16_t h = 0;
  if (t.dtype() != ops::DType::F32) ops::from_f32(&h, t.dtype(), &v, 1);
  t.view(i, {1}).write_from_host(t.dtype() == ops::DType::F32 ? static_cast<const void*>(&v) : &h);
}

}  // namespace

void arm_fault_points(const ops::Knobs::Faults& f) {
  if (f.data_delay_ms) set_batch_build_delay_ms(*f.data_delay_ms);
  if (f.ckpt_after_bytes) set_write_fault_after_bytes(*f.ckpt_after_bytes);
  if (f.ckpt_exit) set_write_fault_exit(true);
  if (f.ckpt_slow_ms) set_write_slow_ms(*f.ckpt_slow_ms);
  if (!f.ckpt_verify_abort.empty()) set_verify_fault_abort(f.ckpt_verify_abort);
}

// -1: the knob is unset (no rank or step is -1).
FaultHook::FaultHook(int world_rank, const ops::Knobs::Faults& f)
    : rank_(world_rank),
      fail_rank_(f.fail_rank.value_or(-1)),
      fail_step_(f.fail_step.value_or(-1)),
      nan_step_(f.nan_step.value_or(-1)),
      inf_step_(f.inf_step.value_or(-1)),
      inf_count_(std::max<int64_t>(1, f.inf_count.value_or(-1))),
      noise_step_(f.noise_step.value_or(-1)),
      step_sleep_ms_(f.step_sleep_ms.value_or(-1)),
      stall_rank_(f.stall_rank.value_or(-1)),
      stall_every_(f.stall_every.value_or(-1)),
      stall_ms_(f.stall_ms.value_or(-1)),
      ckpt_sleep_ms_(f.ckpt_sleep_ms.value_or(-1)),
      ckpt_sleep_rank_(f.ckpt_sleep_rank.value_or(-1)),
      step_sleep_rank_(f.step_sleep_rank.value_or(-1)),
      step_sleep_file_(f.step_sleep_file),
      active_(f.any_step_fault()) {
  arm_fault_points(f);
}

void FaultHook::corrupt_batches(int64_t step, std::vector<Batch>& mbs, int64_t vocab_size) const {
  if (step != noise_step_) return;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (Batch& b : mbs)
    for (size_t i = 0; i < b.tokens.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b.tokens[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab_size));
      b.targets[i] = static_cast<int32_t>((x >> 13) % static_cast<uint64_t>(vocab_size));
    }
}

void FaultHook::stall(int64_t step) const {
  if (stall_rank_ != rank_ || stall_ms_ <= 0 || stall_every_ <= 0 || step % stall_every_ != 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms_));
}

void FaultHook::fail(int64_t step) const {
  if (rank_ == fail_rank_ && step == fail_step_)
    throw std::runtime_error(fmt::format("injected fault at step {} (RUNNER_FAULT_FAIL_RANK)", step));
}

void FaultHook::poison(int64_t step, double& loss_sum, ParamSet& params) {
  if (step == nan_step_) {
    nan_step_ = -1;  // the first time only: a rollback's retry of the step runs clean
    loss_sum = std::nan("");
    set_element(params.grads[0], 0, std::nanf(""));
  }
  if (inf_step_ > 0 && step >= inf_step_ && step < inf_step_ + inf_count_) set_element(params.grads.back(), 0, INFINITY);
}

void FaultHook::sleep_after_step() const {
  if (step_sleep_rank_ >= 0 && step_sleep_rank_ != rank_) return;
  int64_t ms = step_sleep_ms_;
  if (!step_sleep_file_.empty()) {  // the harness's current pace, when it has written one
    std::ifstream f(step_sleep_file_);
    int64_t v = -1;
    if (f >> v) ms = v;
  }
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void FaultHook::sleep_after_checkpoint() const {
  if (ckpt_sleep_ms_ > 0 && (ckpt_sleep_rank_ < 0 || ckpt_sleep_rank_ == rank_))
    std::this_thread::sleep_for(std::chrono::milliseconds(ckpt_sleep_ms_));
}

}  // namespace runner
