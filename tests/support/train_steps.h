// A few training steps of a small GPT graph, as the operator tests compare them (16-bit-native
// kernels on and off, fused operators on and off): the graph of a GptSpec, its parameters
// (init_params, seed 11), AdamW on the parameters in their stored dtype (no fp32 masters), and
// at every step the measured workspace and activation peaks against the dry run's
// (Executor::simulate), which must agree byte for byte.
#pragma once
#include <cstddef>
#include <vector>

#include "runner/model/model.h"

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

}  // namespace test_support
