// `runner calibrate [--out FILE]`: measures this machine for the layout search (runner/device/
// calibrate.h) and writes a hardware profile (runner/device/profile.h). [i27: H fills this in]
#include <iostream>

#include "runner/cli/command.h"

namespace runner::cli {

namespace {

class CalibrateCommand final : public Command {
 public:
  explicit CalibrateCommand(CLI::App& app) {
    sub_ = app.add_subcommand("calibrate",
                              "measure this machine (GEMM, memory bandwidth, attention, MPI collectives) and write a "
                              "hardware profile the layout search reads (plan --search --profile FILE)");
    sub_->add_option("--out", out_, "where to write the profile (JSON)");
  }
  int run(std::optional<Launch>&) override {
    std::cerr << "runner calibrate: not built yet\n";
    return 1;
  }

 private:
  std::string out_ = "hardware-profile.json";
};

}  // namespace

std::unique_ptr<Command> calibrate_command(CLI::App& app) { return std::make_unique<CalibrateCommand>(app); }

}  // namespace runner::cli
