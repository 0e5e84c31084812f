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

namespace runner {

namespace {

int64_t env(const char* name) { return std::getenv(name) ? std::atoll(std::getenv(name)) : -1; }

// Element i := v in t's dtype, written through the crossing in (t may be device memory).
void set_element(ops::Tensor& t, int64_t i, float v) {
  uint16_t h = 0;
  if (t.dtype() != ops::DType::F32) ops::from_f32(&h, t.dtype(), &v, 1);
  t.view(i, {1}).write_from_host(t.dtype() == ops::DType::F32 ? static_cast<const void*>(&v) : &h);
}

}  // namespace

FaultHook::FaultHook(int world_rank)
    : rank_(world_rank),
      fail_rank_(env("RUNNER_FAULT_FAIL_RANK")),
      fail_step_(env("RUNNER_FAULT_FAIL_STEP")),
      nan_step_(env("RUNNER_FAULT_NAN_STEP")),
      inf_step_(env("RUNNER_FAULT_INF_STEP")),
      inf_count_(std::max<int64_t>(1, env("RUNNER_FAULT_INF_COUNT"))),
      noise_step_(env("RUNNER_FAULT_NOISE_STEP")),
      step_sleep_ms_(env("RUNNER_FAULT_STEP_SLEEP_MS")),
      stall_rank_(env("RUNNER_DEBUG_STALL_RANK")),
      stall_every_(env("RUNNER_DEBUG_STALL_EVERY")),
      stall_ms_(env("RUNNER_DEBUG_STALL_MS")),
      ckpt_sleep_ms_(env("RUNNER_FAULT_CKPT_SLEEP_MS")),
      ckpt_sleep_rank_(env("RUNNER_FAULT_CKPT_SLEEP_RANK")),
      step_sleep_rank_(env("RUNNER_FAULT_STEP_SLEEP_RANK")),
      step_sleep_file_(std::getenv("RUNNER_FAULT_STEP_SLEEP_FILE") ? std::getenv("RUNNER_FAULT_STEP_SLEEP_FILE") : "") {
  for (const char* v : {"RUNNER_FAULT_FAIL_RANK", "RUNNER_FAULT_FAIL_STEP", "RUNNER_FAULT_NAN_STEP", "RUNNER_FAULT_INF_STEP",
                        "RUNNER_FAULT_INF_COUNT", "RUNNER_FAULT_NOISE_STEP", "RUNNER_FAULT_STEP_SLEEP_MS",
                        "RUNNER_DEBUG_STALL_RANK", "RUNNER_DEBUG_STALL_EVERY", "RUNNER_DEBUG_STALL_MS",
                        "RUNNER_FAULT_CKPT_SLEEP_MS", "RUNNER_FAULT_STEP_SLEEP_FILE"})
    active_ = active_ || std::getenv(v) != nullptr;
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
