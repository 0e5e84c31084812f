// `runner data prepare TEXT OUT`: a text file turned into an HDF5 token dataset (byte-level).
// A signal stops it cleanly (no half-written output).
#include <iostream>

#include "runner/cli/command.h"
#include "runner/data/data.h"
#include "runner/signals.h"

namespace runner::cli {

namespace {

class DataCommand final : public Command {
 public:
  explicit DataCommand(CLI::App& app) {
    CLI::App* data = app.add_subcommand("data", "data utilities");
    data->require_subcommand(1);
    sub_ = data->add_subcommand("prepare", "turn a text file into an HDF5 token dataset (byte-level)");
    sub_->add_option("text", text_path_, "UTF-8 text file")->required();
    sub_->add_option("out", out_path_, "output .h5 file")->required();
    sub_->add_flag("--binary-ok", binary_ok_, "tokenize the bytes of a file that is not text (refused otherwise)");
  }

  int run(std::optional<Launch>&) override {
    install_signal_handlers(StopWork::data_prepare);
    int64_t n = prepare_text_to_hdf5(text_path_, out_path_, &stop_flag(), binary_ok_);
    std::cout << "wrote " << n << " tokens to " << out_path_ << "\n";
    return 0;
  }

 private:
  std::string text_path_, out_path_;
  bool binary_ok_ = false;
};

}  // namespace

std::unique_ptr<Command> data_command(CLI::App& app) { return std::make_unique<DataCommand>(app); }

}  // namespace runner::cli
