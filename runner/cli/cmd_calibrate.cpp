// `runner calibrate [--out FILE] [--quick] [--threads LIST] [--device KIND]`: measures this
// machine for the layout search (runner/perf/calibrate.h) and writes a hardware profile
// (runner/perf/hardware_profile.h). Under mpirun/srun it also measures the collectives over the job's
// ranks; rank 0 writes the file and prints the summary.
#include <fstream>
#include <iostream>

#include "runner/atomic_output.h"
#include "runner/cli/command.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#include "runner/perf/calibrate.h"

namespace runner::cli {

namespace {

class CalibrateCommand final : public Command {
 public:
  explicit CalibrateCommand(CLI::App& app) {
    sub_ = app.add_subcommand("calibrate",
                              "measure this machine (GEMM, memory bandwidth, attention, MPI collectives) and write a "
                              "hardware profile the layout search reads (plan --search --profile FILE)");
    sub_->add_option("--out", out_, "where to write the profile (JSON)");
    sub_->add_flag("--quick", quick_, "a few shapes and message sizes (seconds; for tests), not the full grid");
    sub_->add_option("--threads", threads_, "CPU thread counts to measure, e.g. 1,2 (default: 1, 2, 4, ... and the cores)")
        ->delimiter(',');
    sub_->add_option("--device", device_, "the hardware.device kind to measure (default cpu; cuda or a GPU kind: the "
                                          "CUDA backend)");
  }
  Start start() const override { return Start::ranks_if_launched; }
  int run(std::optional<Launch>& launch) override {
    check();
    std::unique_ptr<parallel::Communicator> world = launch ? launch->take_world() : nullptr;
    const int rank = world ? world->rank() : 0;
    CalibrateOptions o;
    o.device = device_;
    o.quick = quick_;
    o.threads = threads_;
    if (rank == 0) o.progress = [](const std::string& line) { std::cerr << "calibrate: " << line << "\n"; };
    const HardwareProfile p = calibrate(o, world.get());
    if (rank != 0) return 0;
    // Replaced whole (calibrating again refreshes the profile): a failed write keeps the last one.
    StagedFile(out_, true, "calibrate").commit(p.to_json().dump(2) + "\n");
    std::cout << calibrate_summary(p) << "wrote " << out_
              << " (name it in the recipe's hardware.profile, or pass plan --search --profile " << out_ << ")\n";
    return 0;
  }

 private:
  void check() const {
    for (int t : threads_)
      if (t < 1) throw UserError(SourceLoc{"--threads"}, "a thread count must be at least 1", "e.g. --threads 1,2");
    if (!find_device_kind(device_)) {
      std::string kinds;
      for (const DeviceKind& d : device_kinds()) kinds += (kinds.empty() ? "" : ", ") + std::string(d.name);
      throw UserError(SourceLoc{"--device"}, "unknown device kind " + device_, "one of " + kinds);
    }
  }
  std::string out_ = "hardware-profile.json";
  bool quick_ = false;
  std::vector<int> threads_;
  std::string device_ = "cpu";
};

}  // namespace

std::unique_ptr<Command> calibrate_command(CLI::App& app) { return std::make_unique<CalibrateCommand>(app); }

}  // namespace runner::cli
