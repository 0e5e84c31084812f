// `runner import`: a Hugging Face model (safetensors + config.json, GPT-2 or Llama layout) as a
// runner checkpoint that `runner train` starts from (model.init_from), and `generate` and
// `export` read.
//
// Design: the checkpoint is the runner's own file, written by the checkpoint room's writer
// (write_checkpoint_atomic) into OUT/checkpoints/ at step 0, so OUT reads like a run directory
// (its LATEST checkpoint; OUT/tokenizer/ as RUN_DIR/tokenizer/). The names are the inverse of
// runner/model/gpt.h's hf_tensors(), the table export writes through: every Hugging Face
// tensor lands on the rows of the logical parameter it was cut from (transposed back for
// GPT-2's Conv1D), so import then export gives the same bytes. F16 and BF16 widen to fp32
// exactly (a checkpoint stores fp32 parameters), so `export --dtype bf16` of a bf16 import is
// bit-exact too. Everything is read and checked before anything is written.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runner/model/gpt.h"
#include "runner/recipe/recipe.h"

namespace runner {

struct ImportResult {
  std::string checkpoint;   // OUT/checkpoints/step_00000000.h5
  std::string recipe_path;  // the editable fine-tuning recipe
  std::string architecture;  // "GPT2LMHeadModel" or "LlamaForCausalLM"
  ModelConfig model;
  int64_t tensors = 0, parameters = 0;
  std::vector<std::string> tokenizer_files;  // copied into OUT/tokenizer/
  std::vector<std::string> notes;            // what the user should know (ignored buffers, no tokenizer, ...)
};

// The model section of a Hugging Face config.json (GPT2LMHeadModel or LlamaForCausalLM).
// Throws UserError at `path` naming the field (unknown architecture, a setting the runner's
// model does not have). `style` gets the layout of the tensor names.
ModelConfig model_from_hf_config(const std::string& json_text, const std::string& path, HfStyle& style);

// Reads SOURCE (a directory with config.json and model.safetensors or a sharded
// model.safetensors.index.json; or one .safetensors file, or the index, with config.json beside
// it), checks every tensor (missing, shape, dtype, a truncated or corrupt header: UserError
// naming the file and the tensor), then writes OUT/checkpoints/step_00000000.h5 (+ LATEST), the
// tokenizer files found beside the weights into OUT/tokenizer/, and the recipe (`recipe_out`;
// empty: OUT/finetune.yaml) whose model section is the config's and whose model.init_from
// points at OUT. OUT is built beside and swapped in whole (runner/atomic_output.h); a non-empty
// OUT, or an existing --recipe-out file, is refused unless `force`. `progress` hears what is read.
// A tokenizer beside the weights must load with the runner's tokenizer loader (UserError
// naming it otherwise: it is not copied). Non-finite weights are refused, naming the tensor.
ImportResult import_model(const std::string& source, const std::string& out_dir, const std::string& recipe_out,
                          const std::function<void(const std::string&)>& progress = {}, bool force = false);

}  // namespace runner
