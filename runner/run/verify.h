// `runner plan --search --verify K`: the top K layouts run for a few steps each (under mpirun,
// or srun inside a Slurm allocation, at the search's world size) and re-ranked by measured
// step time, predicted printed beside measured: model-based pruning, then a short measurement.
// [i27: V owns verify.cpp]
#pragma once
#include <string>

#include "runner/plan/search.h"

namespace runner {

struct VerifyOptions {
  int k = 3;              // how many of the top candidates to run
  int steps = 6;          // steps per run (the first ones, warm-up, are not timed)
  std::string runner;     // this runner's executable (/proc/self/exe)
  std::string work_dir;   // where the trial runs' directories go (removed after)
};

// Runs the top k of `result`, fills their measured_step_s and re-sorts result.candidates by it
// (unmeasured ones after). Prints progress to stderr. A trial that fails is reported and ranked last.
void verify_layouts(SearchResult& result, const VerifyOptions& opt);

}  // namespace runner
