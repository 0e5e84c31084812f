// The records the training loop hands to its observers (metrics, monitor, profiler): one
// step as measured, one evaluation, one gradient range report. Plain data, so the observers
// (runner/observe/) stand below the loop (runner/train/) that produces them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace runner {

// One logical parameter's gradient over the whole model (every element once), unscaled.
struct GradRange {
  std::string name;
  int layer = -1;             // transformer layer, -1 outside the blocks
  int64_t numel = 0, zeros = 0, nonfinite = 0;
  double max_abs = 0;         // largest finite |gradient|
  // Fraction of the elements that are non-zero but below fp16's smallest subnormal once
  // multiplied by the scale: they would flush to zero in fp16 at that scale.
  double underflow = 0;
  // log2(65504 / (max_abs * scale)): doublings of the scale left before this tensor overflows
  // fp16 (+inf for an all-zero gradient).
  double headroom_bits = 0;
  // The range of scales that suit this tensor: no overflow (< hi) and at most 1% of its
  // gradient norm flushed to zero (>= lo).
  double scale_lo = 0, scale_hi = 0;
};

struct GradReport {
  double scale = 1;
  std::vector<GradRange> tensors;  // the layout's table order
  int first_nonfinite = -1;        // index into tensors of the first non-finite one in backward order; -1: none
  // When no single scale suits every tensor: the tensor needing the largest scale (small
  // gradients) and the one allowing the smallest (large gradients); -1 otherwise.
  int needs_large = -1, needs_small = -1;
  bool conflict() const { return needs_large >= 0; }
};

// "h.3.attn.qkv.weight (layer 3)", "wte (embedding)".
std::string describe_tensor(const GradRange& t);

// A held-out evaluation (runner/train/evaluate.h).
struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // -1: no task accuracy for this data kind
  int64_t problems = 0;
};

// One optimizer step as the trainer measured it.
struct StepResult {
  double loss = 0, norm = 0, lr = 0;
  double data_ms = 0, fwd_ms = 0, bwd_ms = 0, opt_ms = 0, total_ms = 0;
  double comm_hidden_ms = 0, comm_exposed_ms = 0, pipe_wait_ms = 0;
  // The rest of the coarse breakdown (see Breakdown): gradient range reports for the loss
  // scaler and precision diagnostics; rolled-back attempts, restores and snapshots since the
  // last record; checkpoint saves and polls since the last record (outside total_ms).
  double loss_scale_ms = 0, rollback_ms = 0, checkpoint_ms = 0;
  bool skipped = false;
  double scale = 1;            // the loss scale the step ran with
  bool overflow = false;       // fp16 gradients overflowed: skipped by the loss scaler
  std::string overflow_tensor; // the first non-finite gradient in backward order
  std::optional<GradReport> diagnostics;  // per-tensor gradient range (precision.diagnostics)
};

}  // namespace runner
