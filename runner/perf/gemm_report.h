// Which GEMM path a run's compute format takes on this machine, in words, and whether 16-bit
// compute is slower than fp32 here: for `runner plan` and the start-up banner.
//
// The paths themselves are chosen (and measured) by ops/gemm_path.h; this only says what the
// choice means for the user. 16-bit compute on the sgemm path widens its operands and runs
// fp32's own sgemm, so it is known slower than fp32 (the conversions come on top) and saves
// memory, not time; on oneDNN's path it is slower when the probe measured it so. Either way the
// user is told before a run of hours, with what to do.
#pragma once
#include <string>
#include <vector>

#include "runner/recipe/recipe.h"

namespace runner {

struct GemmReport {
  // The run's format first, then fp32 when that is another: "bf16: onednn-bf16 (oneDNN's bf16
  // matmul, kernel brg:avx512_core_amx_bf16: AMX) | measured ...", "fp32: fp32-sgemm (...)".
  std::vector<std::string> lines;
  std::string warning;  // empty: 16-bit compute is not known slower than fp32 here
};

// For a run computing in `compute`. 16-bit compute reads ops::gemm_paths(), which measures the
// paths on first use (a few hundred milliseconds); fp32 measures nothing. Under the GPU's paths
// (ops::device_gemm_paths(): a GPU run, or a ScopedGemmPaths for a GPU recipe's plan) it names
// cuBLASLt and measures nothing.
GemmReport gemm_report(FloatFormat compute);

}  // namespace runner
