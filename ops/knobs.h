// The runner's environment knobs: every RUNNER_* variable, read in one place, once, into typed
// fields. ops/ is the lowest layer that needs any of them, so the table lives here and the
// layers above (parallel/, runner/, the tests) read it through knobs(); no other file calls
// getenv for a RUNNER_* name. docs/knobs.md lists each knob: its type, default, what it does
// and who it is for (users, debugging, tests).
//
// Parsing is strict: an integer or number that does not parse, or a flag that is not one of
// 1/0/true/false/yes/no/on/off, throws std::invalid_argument naming the variable and its value.
// An empty value counts as unset. The few knobs whose values are words (RUNNER_GEMM_PATH,
// RUNNER_PEAK_CACHE) are kept as given and checked where they are used, whose error says which
// words it takes (and exits 2 in the runner before anything is written).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace ops {

struct Knobs {
  // ---- users ----
  std::string gemm_path;                   // RUNNER_GEMM_PATH: auto | onednn | sgemm (ops/gemm_path.h)
  std::string peak_cache;                  // RUNNER_PEAK_CACHE: on | off | refresh (runner/perf/peak.h)
  std::string schema;                      // RUNNER_SCHEMA: the recipe schema file
  bool host_staged_comm = false;           // RUNNER_HOST_STAGED_COMM: GPU ranks talk through host memory
  bool native16 = true;                    // RUNNER_NATIVE16: 16-bit-native kernels (0: widen to fp32)
  std::optional<double> strict_arena_gib;  // RUNNER_STRICT_ARENA_GIB: the strict device's memory
  bool strict = false;                     // RUNNER_STRICT: recipes on `cpu` run on `cpu-strict`
  std::string exit_record;                 // RUNNER_EXIT_RECORD: the batch script's rank-exit file

  // ---- fault injection (tests, debugging): runner/train/fault_hook.h turns these into events ----
  struct Faults {
    std::optional<int64_t> fail_rank, fail_step;                // RUNNER_FAULT_FAIL_RANK, _STEP
    std::optional<int64_t> nan_step;                            // RUNNER_FAULT_NAN_STEP
    std::optional<int64_t> inf_step, inf_count;                 // RUNNER_FAULT_INF_STEP, _COUNT
    std::optional<int64_t> noise_step;                          // RUNNER_FAULT_NOISE_STEP
    std::optional<int64_t> step_sleep_ms, step_sleep_rank;      // RUNNER_FAULT_STEP_SLEEP_MS, _RANK
    std::string step_sleep_file;                                // RUNNER_FAULT_STEP_SLEEP_FILE
    std::optional<int64_t> ckpt_sleep_ms, ckpt_sleep_rank;      // RUNNER_FAULT_CKPT_SLEEP_MS, _RANK
    std::optional<int64_t> stall_rank, stall_every, stall_ms;   // RUNNER_DEBUG_STALL_RANK, _EVERY, _MS
    std::optional<int64_t> data_delay_ms;                       // RUNNER_DEBUG_DATA_DELAY_MS
    std::optional<int64_t> ckpt_after_bytes;                    // RUNNER_CKPT_FAULT_AFTER_BYTES
    bool ckpt_exit = false;                                     // RUNNER_CKPT_FAULT_EXIT
    std::optional<int64_t> ckpt_slow_ms;                        // RUNNER_CKPT_FAULT_SLOW_MS
    std::string ckpt_verify_abort;                              // RUNNER_CKPT_FAULT_VERIFY_ABORT
    // Whether any of the training step's faults is set (the fault hook is inactive otherwise).
    bool any_step_fault() const;
  } faults;

  // ---- the test suite ----
  bool expect_gpu = false;      // RUNNER_EXPECT_GPU: this machine has a GPU (scripts/gpu-check.sh)
  bool keep_test_dirs = false;  // RUNNER_KEEP_TEST_DIRS: tests keep their temporary directories
  std::string pckpt_child;      // RUNNER_PCKPT_CHILD: test_parallel_ckpt's rank-child arguments
};

// The knobs, read from the environment on the first call (which throws std::invalid_argument on
// a malformed value, and again on every later call until the environment is fixed).
const Knobs& knobs();

// Reads the environment again: for tests that set a variable at run time (tests/support/env.h
// wraps it), and nothing else. Not safe while another thread reads knobs().
const Knobs& reload_knobs();

// The knobs of an environment given as a lookup (name -> value or nullptr), without touching the
// process's own: what knobs() does with getenv.
Knobs read_knobs(const char* (*lookup)(const char* name));

}  // namespace ops
