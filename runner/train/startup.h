// What a run says and writes when it starts and ends, apart from the loop: the start-up banner
// (the grid, the plan's table, data, threads, precision, optimizer), the run files (the resolved
// recipe, plan.json, gemm_paths.json) and the end event `runner status` reads. Pure functions of
// the plan and a few measured facts, so the trainer only gathers the facts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/grid.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/train/precision.h"

namespace spdlog {
class logger;
}

namespace runner {

// The rank's OpenMP threads: train.threads when set; else OMP_NUM_THREADS when set; else the
// machine's cores shared between the ranks on it.
void choose_threads(const Recipe& r);

// OpenMP threads that spin while they wait take cores from every other process on a busy
// machine (steps ran 7-14x slower than with passive waiting), so passive waiting is the
// default: when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, this sets
// OMP_WAIT_POLICY=PASSIVE and executes this program again with the same arguments, because the
// OpenMP runtime (which OpenBLAS and oneDNN share) reads it once, when it is loaded, before
// main. Call first thing in main; returns only when nothing was to be done or exec failed.
void default_passive_waiting(char** argv);

// The run's logger: RUN_DIR/log.rankR.txt (the directory is created), and stdout when
// `to_stdout`; lines carry the rank's grid coordinates when the job has several.
std::shared_ptr<spdlog::logger> open_run_log(const std::string& run_dir, const parallel::Grid& grid, bool to_stdout);

// What the banner reports beyond the plan and the grid.
struct StartupFacts {
  std::string run_dir;
  std::string data;          // the training source, described
  int64_t buckets = 0;       // data-parallel gradient buckets
  bool zero1 = false;
  double peak_flops = 0;     // the job's peak, for MFU (all ranks together)
  std::string peak_source;   // where it came from (runner/perf/peak.h)
  std::string precision;     // precision_line()
};

// The banner, one line at a time on `log`.
void print_startup(spdlog::logger& log, const Plan& plan, const parallel::Grid& grid, const StartupFacts& facts);

// "bf16 weights and activations | fp32 master weights | ... | loss scale dynamic from 65536 ...":
// the banner's precision line; `scale` is the loss scale the run starts from, `diagnose`
// whether gradient range diagnostics are on.
std::string precision_line(const PrecisionConfig& p, const LossScaler& scaler, double scale, bool diagnose);

// The recipe as resolved: every default and every derived number filled in.
std::string resolved_recipe_yaml(const Plan& plan);

// Rank 0's run files in `run_dir`: recipe.yaml, plan.json and, for 16-bit compute, which GEMM
// each 16-bit dtype took (gemm_paths.json; a continuation of this run directory takes the same
// paths, Launch::agree_gemm_paths).
void write_run_files(const Plan& plan, const std::string& run_dir);

// Rank 0: the end of this job on the run directory (`cause`, the step reached, the exit code,
// and for a preemption the signal).
void append_end_event(const std::string& run_dir, const char* cause, int64_t step, int code);

}  // namespace runner
