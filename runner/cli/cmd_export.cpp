// `runner export SOURCE --out DIR`: a trained model written as safetensors + config.json +
// generation_config.json + the run's tokenizer files (Hugging Face GPT-2 / Llama layouts), or npz
// (runner/export/). The model loads on the device the stored recipe names (hardware.device,
// --set to change it), as generate's does, and every weight is staged out of it to be written.
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/tensor.h"
#include "runner/cli/command.h"
#include "runner/export/export.h"
#include "runner/signals.h"
#include "runner/trained/trained_model.h"

namespace runner::cli {

namespace {

std::string size_text(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  const bool mib = bytes >= 1024 * 1024;
  return fmt::format("{:.1f} {}", static_cast<double>(bytes) / (mib ? 1024.0 * 1024.0 : 1024.0), mib ? "MiB" : "KiB");
}

class ExportCommand final : public Command {
 public:
  explicit ExportCommand(CLI::App& app) {
    sub_ = app.add_subcommand("export", "write a trained model as safetensors + config.json (Hugging Face "
                                        "GPT-2 / Llama layouts) or npz");
    sub_->add_option("source", src_, "run directory (its latest checkpoint) or checkpoint .h5 file")->required();
    sub_->add_option("--out", out_, "output directory")->required();
    sub_->add_option("--format", format_, "safetensors (default) or npz")->check(CLI::IsMember({"safetensors", "npz"}));
    sub_->add_option("--dtype", dtype_, "tensor type: fp32 (default), bf16 or fp16 (safetensors only)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    sub_->add_flag("--force", force_, "replace an existing non-empty OUT (only once the new export is complete)");
    sub_->add_option("--set", sets_, "override a field of the stored recipe, e.g. --set hardware.device=cpu")->take_all();
  }

  int run(std::optional<Launch>&) override {
    ops::DType dt = ops::DType::F32;
    ops::parse_dtype(dtype_, &dt);
    const ExportFormat format = format_ == "npz" ? ExportFormat::npz : ExportFormat::safetensors;
    check_export_request(format, dt);
    install_signal_handlers(StopWork::output);
    // OUT's lock and checks first: a second export to the same OUT, or an existing one without
    // --force, is refused before the model is loaded.
    StagedDir out(out_, force_, "export", "--force", {src_});
    TrainedModel m = load_trained_model(src_, sets_);
    throw_if_stopped(out_);
    ExportResult r = export_model(m, format, out, dt);
    std::cout << "exported step " << m.step << " of " << m.checkpoint << " (" << r.style << " layout, " << r.tensors
              << " tensors, " << size_text(r.bytes) << ") to " << r.weights_path << " and " << r.config_path << "\n";
    for (const std::string& n : r.notes) std::cout << "note: " << n << "\n";
    if (format_ == "npz") return 0;
    std::cout << "generation config: " << r.generation_config_path << "\n";
    if (!r.tokenizer_files.empty()) {
      std::cout << "tokenizer (" << r.tokenizer_kind << "): " << fmt::format("{}", fmt::join(r.tokenizer_files, ", "))
                << "\nload: transformers.AutoModelForCausalLM.from_pretrained(\"" << out_
                << "\") and transformers.AutoTokenizer.from_pretrained(\"" << out_ << "\")\n";
    } else {
      // The byte tokenizer has no files Hugging Face's AutoTokenizer loads: say how to feed the model.
      std::cout << "tokenizer: none, the model reads raw bytes (the byte tokenizer has no files to ship)\n"
                << "load: transformers.AutoModelForCausalLM.from_pretrained(\"" << out_
                << "\"); the tokens are the text's bytes (no tokenizer files): input_ids = list(text.encode(\"utf-8\"))\n";
    }
    return 0;
  }

 private:
  std::string src_, out_, format_ = "safetensors", dtype_ = "fp32";
  bool force_ = false;
  std::vector<std::string> sets_;
};

}  // namespace

std::unique_ptr<Command> export_command(CLI::App& app) { return std::make_unique<ExportCommand>(app); }

}  // namespace runner::cli
