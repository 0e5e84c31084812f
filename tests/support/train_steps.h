// A few training steps of a small GPT graph, as the operator tests compare them (16-bit-native
// kernels on and off, fused operators on and off): the graph of a GptSpec, its parameters
// (init_params, seed 11), AdamW on the parameters in their stored dtype (no fp32 masters), and
// at every step the measured workspace and activation peaks against the dry run's
// (Executor::simulate), which must agree byte for byte.
#pragma once
#include <cstddef>
#include <cstring>
#include <vector>

#include "runner/model/gpt.h"

namespace test_support {

struct TrainSteps {
  std::vector<double> losses;                      // per step
  std::vector<std::vector<float>> grads, weights;  // after the last step, widened to fp32
  size_t workspace_peak = 0;                       // the largest step's measured workspace peak
  bool dry_run_exact = true;                       // every step's peaks equal the dry run's
};

// `steps` steps on the test device (tests/support/device.h): step s reads tokens s.. of
// random_tokens, dropout key 100 + s; AdamW lr 1e-2, betas (0.9, 0.95), eps 1e-8.
TrainSteps train_steps(const runner::GptSpec& spec, int steps);
// The same with the 16-bit-native kernels switched on or off (ops::set_native16; on again
// after), CHECKing that the dry run was exact in that mode.
TrainSteps train_steps_native16(const runner::GptSpec& spec, bool native, int steps);
// The same for model `m` at micro-batch B, activations stored in `act`, gradients in `grad`.
TrainSteps train_steps_native16(const runner::ModelConfig& m, ops::DType act, bool native, int steps, int64_t B,
                                ops::DType grad = ops::DType::F32);

// Two containers of the same element type hold the same bytes.
template <class A>
bool same_bits(const A& a, const A& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

// CHECKs that two runs are the same bit for bit: every step's loss and, after the last step,
// every gradient (with `weights`, every parameter too), naming the step or parameter that differs.
void check_same_bits(const TrainSteps& a, const TrainSteps& b, bool weights = false);

}  // namespace test_support
