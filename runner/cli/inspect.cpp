// `runner inspect CHECKPOINT`: what a checkpoint holds, its checksums verified, read in an
// isolated process so that a crash inside HDF5 reads as a corrupt file. And the hidden
// `runner __verify-checkpoint CHECKPOINT`: the fresh process in which resume verification runs
// under MPI (runner/checkpoint/isolated.h), writing one record on stdout for its parent.
#include <cstdio>
#include <iostream>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/isolated.h"
#include "runner/cli/command.h"
#include "runner/errors.h"

namespace runner::cli {

namespace {

class InspectCommand final : public Command {
 public:
  explicit InspectCommand(CLI::App& app) {
    sub_ = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
    sub_->add_option("checkpoint", ckpt_path_, "checkpoint .h5 file")->required();
  }

  int run(std::optional<Launch>&) override {
    bool ok = false;
    std::cout << inspect_checkpoint_isolated(ckpt_path_, &ok);  // a crash in HDF5 is a corrupt file
    return ok ? 0 : kExitUserError;
  }

 private:
  std::string ckpt_path_;
};

class VerifyCheckpointCommand final : public Command {
 public:
  explicit VerifyCheckpointCommand(CLI::App& app) {
    sub_ = app.add_subcommand("__verify-checkpoint", "")->group("");
    sub_->add_option("checkpoint", verify_path_)->required();
  }

  // No MPI, no logging: one record on stdout (isolated.cpp reads it).
  Start start() const override { return Start::isolated; }

  int run(std::optional<Launch>&) override {
    const std::string rec = verify_record(verify_path_);
    return std::fwrite(rec.data(), 1, rec.size(), stdout) == rec.size() && std::fflush(stdout) == 0 ? 0 : 1;
  }

 private:
  std::string verify_path_;
};

}  // namespace

std::unique_ptr<Command> inspect_command(CLI::App& app) { return std::make_unique<InspectCommand>(app); }
std::unique_ptr<Command> verify_checkpoint_command(CLI::App& app) {
  return std::make_unique<VerifyCheckpointCommand>(app);
}

}  // namespace runner::cli
