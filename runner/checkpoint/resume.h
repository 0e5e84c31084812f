// The resume chooser: which checkpoint a run continues from, chosen once, and loading it into
// the training state.
//
// Design: the choice is made before anything is planned or built (`runner resume` reads the
// chosen checkpoint's recipe to plan the run; a `runner train` that finds checkpoints asks the
// same function), by verifying the candidates newest first, each in a child process
// (isolated.h): a file that does not verify, or crashes the reader, is skipped with a note, or
// is the error when strict. Loading then reads exactly the chosen file, on every rank,
// in-process (it has just verified). This is the only fallback between checkpoints.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/grid.h"
#include "runner/plan/plan.h"
#include "runner/state.h"

namespace spdlog {
class logger;
}

namespace runner {

// The checkpoint a run continues from.
struct ResumePoint {
  std::string path;
  int64_t step = -1;
  std::vector<std::string> skipped;  // newer checkpoints that did not verify, and why (logged by the trainer)
};

// The files to try, newest first (names in `checkpoint_dir`): LATEST, or step_<step>.h5 when
// step >= 0 (a UserError listing the steps there are when it is missing), then the older steps.
// Without a valid LATEST the newest step file comes first, which `log` hears. Empty: the
// directory holds no checkpoint.
std::vector<std::string> resume_candidates(const std::string& checkpoint_dir, int64_t step, spdlog::logger& log);

// Chooses it once: the first candidate that verifies; strict: a checkpoint that does not verify
// is the error. nullopt: the directory holds no checkpoint. Throws UserError when none verifies.
// Reads nothing but `checkpoint_dir` and writes nothing; `log` (default: spdlog's) hears about a
// missing LATEST.
std::optional<ResumePoint> choose_resume_point(const std::string& checkpoint_dir, int64_t step, bool strict,
                                               std::shared_ptr<spdlog::logger> log = nullptr);

// Collective over grid.world(): loads this rank's part of `point` into `st` (one rank with fp32
// weights: its own tensors; otherwise the logical tensors of its parameters, from any layout,
// sliced for this rank) and checks that every rank loaded the same step, which it returns.
// `log` (default: spdlog's) hears which file was loaded.
int64_t load_resume_point(const ResumePoint& point, const Plan& plan, parallel::Grid& grid, TrainState& st,
                          std::shared_ptr<spdlog::logger> log = nullptr);

}  // namespace runner
