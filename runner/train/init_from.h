// model.init_from: a run that starts from the weights of a checkpoint (`runner import`'s
// output, another run's directory, or one checkpoint file) with a fresh optimizer at step 0.
//
// Design: the weights are the checkpoint's logical tensors, loaded through the same path a
// resume on another layout takes (logical_template, load_checkpoint_file, load_local_from_logical:
// each rank its tensor-parallel shard of its pipeline stage's parameters); only the values are
// kept, the step, RNG, data cursor, loss scaler and Adam moments stay the new run's. The
// recipe's model section is compared with the one stored in the checkpoint before anything is
// written, each difference listed (exit 2). A run directory that already has checkpoints
// resumes from them instead: init_from only says where step 0 comes from.
#pragma once
#include <optional>
#include <string>

#include "parallel/grid.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/state.h"

namespace runner {

struct InitFrom {
  std::string source;         // model.init_from, resolved
  std::string checkpoint;     // the file loaded
  int64_t step = 0;           // the step it was saved at (0 for an import)
  std::string tokenizer_dir;  // its run directory's tokenizer/ ("" when it has none)
};

// nullopt when model.init_from is empty or `checkpoint_dir` already holds checkpoints (the run
// resumes). Otherwise resolves and verifies the checkpoint and checks the recipe's model section
// against the checkpoint's: a UserError at the recipe's model fields, one entry per difference.
// Reads only; every rank may call it.
std::optional<InitFrom> check_init_from(const Recipe& r, const std::string& checkpoint_dir);

// Each difference between the recipe's model (`want`) and the checkpoint's (`have`) that changes a
// parameter's shape or the function the weights compute, at the recipe's fields.
std::vector<UserError::Entry> model_mismatches(const Recipe& want, const ModelConfig& have, const std::string& source);

// This rank's parameters (and fp32 masters of a 16-bit run) from the checkpoint's logical
// tensors; the rest of `st` (step, optimizer, scaler, RNG, data cursor, recipe) stays as built.
void load_init_weights(const InitFrom& init, const Plan& plan, parallel::Grid& grid, TrainState& st);

// Where RUN_DIR/tokenizer/ comes from at the start of a run: the data's tokenizer (a prepared
// dataset's files; none for byte-level data) or, for token files of unknown origin, the one
// model.init_from's weights came with (`init_dir`, "" when the import had none). Both known and
// different (by Tokenizer::info().hash, bytes included): UserError at model.init_from (exit 2),
// since the ids would mean other text than the weights learned. "": none (bytes).
std::string choose_run_tokenizer(const Recipe& r, const std::string& init_dir);

}  // namespace runner
