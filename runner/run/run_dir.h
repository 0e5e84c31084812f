// A run's directory: where a run's files and checkpoints live, and what `runner resume` (and
// generate or export given a run directory) prepares before anything is planned.
//
// Design: the run directory is a launching matter, a room above plan and checkpoint. It names
// the places (run_paths: the trainer, the Slurm launcher and main agree on them through this
// one function) and composes the rooms below it for a resume: the checkpoint chooser picks the
// point (runner/checkpoint/resume.h), the recipe stored in it plus the user's overrides becomes
// the run's recipe, and plan/ says what a changed layout derives again (runner/plan/relayout.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/checkpoint/resume.h"
#include "runner/recipe/recipe.h"

namespace runner {

struct RunPaths {
  std::string run_dir;         // --run-dir, else train.run_dir, else runs/<name>
  std::string checkpoint_dir;  // checkpoint.dir, else RUN_DIR/checkpoints
};
RunPaths run_paths(const Recipe& r, const std::string& cli_run_dir = "");

// The records of one of a run's JSON-lines files (events.jsonl, metrics.jsonl), in order; a line
// torn by a kill is skipped, a missing file gives none.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// How the run's messages name the checkpoint a restart continues from: "checkpoint 40", or "no
// checkpoint yet" for -1 (the run failed before its first checkpoint and starts over at step 0).
std::string checkpoint_phrase(int64_t step);
// "resumed from step 40", or "started over from step 0 (no checkpoint yet)" for -1.
std::string resumed_phrase(int64_t step);

// The run directory a checkpoint source belongs to: SOURCE itself when it is a directory (a run
// directory, or `runner import`'s output); for a checkpoint file, the directory above its
// checkpoints/ folder (its own folder when that is not called checkpoints).
std::string source_run_dir(const std::string& run_dir_or_checkpoint);
// RUN_DIR/tokenizer: the files of the tokenizer a run's ids belong to (Tokenizer::save's layout).
// No such directory: the run's ids are bytes (the byte tokenizer).
std::string run_tokenizer_dir(const std::string& run_dir);

// `runner resume RUN_DIR [--set ...]`: the recipe stored in the checkpoint chosen to continue
// from, with the user's overrides. The stored recipe holds the dp and accum its layout derived;
// when the overrides change the layout (any parallel.* field), both are derived again unless
// the overrides give them (the global batch stays). Throws UserError (not a run directory, no
// checkpoint, none verifies).
struct ResumeRequest {
  Recipe recipe;
  ResumePoint point;
  std::vector<std::string> notes;  // what the overrides changed and what was derived again (logged by the trainer)
};
ResumeRequest prepare_resume(const std::string& run_dir, const std::vector<std::string>& overrides, int64_t step,
                             bool strict);

}  // namespace runner
