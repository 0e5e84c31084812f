// `runner import SOURCE --out DIR [--recipe-out R.yaml]`: a Hugging Face GPT-2 or Llama model
// (safetensors + config.json) as a runner checkpoint a run starts from (model.init_from) and
// generate and export read (runner/export/import.h).
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runner/cli/command.h"
#include "runner/export/import.h"
#include "runner/signals.h"

namespace runner::cli {

namespace {

std::string param_text(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B parameters", static_cast<double>(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.1f}M parameters", static_cast<double>(n) / 1e6);
  return fmt::format("{} parameters", n);
}

class ImportCommand final : public Command {
 public:
  explicit ImportCommand(CLI::App& app) {
    sub_ = app.add_subcommand("import", "read a Hugging Face GPT-2 / Llama model (safetensors + config.json) into a "
                                        "checkpoint that runs start from (model.init_from)");
    sub_->add_option("source", src_, "model directory (config.json + model.safetensors or a sharded index), or one "
                                     ".safetensors file with config.json beside it")->required();
    sub_->add_option("--out", out_, "output directory: checkpoints/, tokenizer/ and finetune.yaml")->required();
    sub_->add_option("--recipe-out", recipe_, "where to write the fine-tuning recipe (default: OUT/finetune.yaml)");
    sub_->add_flag("--force", force_, "replace a non-empty OUT and an existing --recipe-out file (once the new ones are complete)");
  }

  int run(std::optional<Launch>&) override {
    install_signal_handlers(StopWork::output);
    ImportResult r = import_model(src_, out_, recipe_, [](const std::string& s) { std::cout << s << std::endl; }, force_);
    const ModelConfig& m = r.model;
    std::cout << fmt::format("imported {} ({} layers, d_model {}, {} heads{}, vocabulary {}, {} tensors, {}) to {}\n",
                             r.architecture, m.n_layers, m.d_model, m.n_heads,
                             m.kv_heads() != m.n_heads ? fmt::format(" / {} key-value", m.kv_heads()) : "", m.vocab_size,
                             r.tensors, param_text(r.parameters), r.checkpoint);
    if (!r.tokenizer_files.empty())
      std::cout << fmt::format("tokenizer: {} copied to {}/tokenizer\n", fmt::join(r.tokenizer_files, ", "), out_);
    for (const std::string& n : r.notes) std::cout << "note: " << n << "\n";
    std::cout << "recipe: " << r.recipe_path << " (set data.path, then `runner train " << r.recipe_path
              << "`); generate: `runner generate " << out_ << " --prompt ...`\n";
    return 0;
  }

 private:
  std::string src_, out_, recipe_;
  bool force_ = false;
};

}  // namespace

std::unique_ptr<Command> import_command(CLI::App& app) { return std::make_unique<ImportCommand>(app); }

}  // namespace runner::cli
