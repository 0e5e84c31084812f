// The peak FLOP/s MFU is computed against, and where that figure came from.
//
// A peak measured at every start on a shared machine swings with the neighbours' load (67 to
// 307 GFLOP/s was seen on one 2-core host), so MFU swung with it, up to 91% of a peak caught
// low. So: the recipe's hardware.peak_tflops, else the device table's figure for the compute
// format (devices.h), else this CPU's sgemm peak measured once per machine as the best of
// several rounds and cached under $XDG_CACHE_HOME/runner (else ~/.cache/runner), keyed by the
// CPU model and the thread count; a later start reads the cache and measures nothing (and a
// run's MFU above 100% says the figure is too low and how to re-measure it).
// RUNNER_PEAK_CACHE=off measures at every start and leaves the cache alone; =refresh measures
// now and replaces the cached figure. Every output that prints MFU names the source.
#pragma once
#include <string>

#include "runner/recipe/recipe.h"

namespace runner {

struct MfuPeak {
  double flops = 0;    // FLOP/s of one rank (the trainer sums the ranks')
  // "recipe" (hardware.peak_tflops), "device table", "measured" (now, not cached), "cached".
  std::string kind;
  // One phrase for the start-up line and the summary, e.g. "fp32 sgemm peak of this CPU (Intel
  // Xeon, 2 threads), cached: best of 3 rounds measured 2026-12-03T12:00:00Z, in
  // /home/u/.cache/runner/peak-....json; RUNNER_PEAK_CACHE=refresh re-measures".
  std::string source;
  std::string cache_file;  // the cache file read or written; empty: none
};

// The peak for a run of `hw` computing in `compute` with `threads` OpenMP threads per rank
// (measures this CPU when neither the recipe nor the table knows the device's peak).
MfuPeak mfu_peak(const HardwareConfig& hw, FloatFormat compute, int threads);

// Throws UserError (exit 2) when RUNNER_PEAK_CACHE holds no mode: called before a run
// touches its directory (docs/invariants.md, invariant 6).
void check_peak_cache_env();

// The cache directory: $XDG_CACHE_HOME/runner, else $HOME/.cache/runner; empty when neither
// variable is set.
std::string peak_cache_dir();
// This CPU's model name (/proc/cpuinfo), "unknown CPU" when it cannot be read.
std::string cpu_model();

}  // namespace runner
