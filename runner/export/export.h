// `runner export`: a trained model in the files other tools read.
//
// safetensors: DIR/model.safetensors and DIR/config.json in the Hugging Face layout of the
// model's style (runner/model/gpt.h: hf_style, hf_tensors): GPT-2 (GPT2LMHeadModel: Conv1D
// weights stored (in, out), tanh gelu "gelu_new", tied embeddings) or Llama (LlamaForCausalLM:
// q/k/v and gate/up split out of the fused weights, rotate-half rope). The file is the format's
// own: an 8-byte little-endian header length, the JSON header (dtype, shape, data_offsets per
// tensor; padded with spaces to 8 bytes) and the raw little-endian tensors.
// npz: DIR/model.npz (a stored zip of .npy files, numpy.load reads it) holding the logical
// tensors under the runner's own names (as the checkpoint has them), plus DIR/config.json.
// Tensors are fp32 unless dtype asks for bf16 or fp16 (safetensors only: npy has no bf16).
// With the weights (safetensors): the run's tokenizer files and generation_config.json, so the
// directory loads as model plus tokenizer.
// config.json carries the training's values (dropout, initializer range, norm epsilon), not
// the format's defaults, so that fine-tuning elsewhere continues the same model.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ops/tensor.h"
#include "runner/atomic_output.h"
#include "runner/trained/trained_model.h"

namespace runner {

enum class ExportFormat { safetensors, npz };

struct ExportResult {
  std::string weights_path, config_path;
  std::string generation_config_path;       // safetensors: generation_config.json
  std::string tokenizer_kind;               // the run's tokenizer ("byte" when it has none)
  std::vector<std::string> tokenizer_files;  // written beside the weights (none for bytes)
  std::string style;   // "gpt2", "llama", or "runner" (npz)
  int64_t tensors = 0, bytes = 0;
  std::vector<std::string> notes;  // what of the training the format cannot carry
};

// Throws UserError when the model has no Hugging Face counterpart (safetensors), the dtype does
// not suit the format, the run's tokenizer cannot be read, or the output cannot be written.
// safetensors also writes the run's tokenizer (TrainedModel::tokenizer_dir, through
// Tokenizer::save: the files Hugging Face's AutoTokenizer reads; none for the byte tokenizer)
// and generation_config.json (its begin and end token ids, max_length = seq_len).
// The request's own mistakes (a dtype the format cannot hold), checked before anything is read or
// made; export_model checks them too.
void check_export_request(ExportFormat format, ops::DType dtype);

// The files are written into `out` (runner/atomic_output.h: built beside the output directory,
// swapped in by commit() once complete); the result's paths are the output directory's.
ExportResult export_model(const TrainedModel& m, ExportFormat format, StagedDir& out, ops::DType dtype = ops::DType::F32);

// The config.json of the model in the style's Hugging Face conventions (npz: the runner's
// model section and the style it would map to, if any).
// bos/eos: the tokenizer's begin and end token ids (nullopt: none, written as null).
struct SpecialTokens {
  std::optional<int32_t> bos, eos;
};
std::string export_config_json(const TrainedModel& m, ExportFormat format, ops::DType dtype, const SpecialTokens& ids = {});

}  // namespace runner
