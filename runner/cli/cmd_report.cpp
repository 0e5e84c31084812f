// `runner report RUN_DIR`: RUN_DIR/report.html, one self-contained page of the run
// (runner/report/).
#include <iostream>

#include "runner/cli/command.h"
#include "runner/report/report.h"

namespace runner::cli {

namespace {

class ReportCommand final : public Command {
 public:
  explicit ReportCommand(CLI::App& app) {
    sub_ = app.add_subcommand("report", "write RUN_DIR/report.html: curves, breakdown, memory, operators, alerts (one self-contained file)");
    sub_->add_option("run_dir", report_dir_, "run directory (runs/NAME)")->required();
  }

  int run(std::optional<Launch>&) override {
    ReportInfo r = write_report(report_dir_);
    std::cout << "wrote " << r.path.string() << " (" << r.steps << " steps" << (r.finished ? "" : ", run in progress")
              << (r.profiled ? ", profiled" : "") << ")\n";
    return 0;
  }

 private:
  std::string report_dir_;
};

}  // namespace

std::unique_ptr<Command> report_command(CLI::App& app) { return std::make_unique<ReportCommand>(app); }

}  // namespace runner::cli
