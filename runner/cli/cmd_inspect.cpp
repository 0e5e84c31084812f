// `runner inspect CHECKPOINT`: what a checkpoint holds, its checksums verified, read in an
// isolated process so that a crash inside HDF5 reads as a corrupt file. And the hidden
// `runner __verify-checkpoint CHECKPOINT`: the fresh process in which resume verification runs
// under MPI (runner/checkpoint/isolated.h), writing one record on stdout for its parent.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/isolated.h"
#include "runner/cli/command.h"
#include "runner/errors.h"
#include "runner/recipe/recipe.h"
#include "runner/run/run_dir.h"

namespace runner::cli {

namespace {

namespace fs = std::filesystem;

// The checkpoint directory of `dir`: a run directory (its recipe may place the checkpoints
// elsewhere), or a checkpoint directory itself.
std::string checkpoint_dir_of(const fs::path& dir) {
  if (!list_checkpoint_steps(dir.string()).empty()) return dir.string();
  if (fs::exists(dir / "recipe.yaml")) {
    try {
      return run_paths(load_recipe((dir / "recipe.yaml").string()), dir.string()).checkpoint_dir;
    } catch (const UserError&) {  // a recipe of another version: the default place
    }
  }
  return (dir / "checkpoints").string();
}

// `runner inspect RUN_DIR` inspects the run's latest checkpoint, as export and generate read
// it; the line above the record says which, and what else is there.
std::string choose_checkpoint(const std::string& arg) {
  const fs::path dir(arg);
  if (!fs::is_directory(dir)) return arg;
  const std::string ckpt = checkpoint_dir_of(dir);
  const std::vector<int64_t> steps = list_checkpoint_steps(ckpt);
  if (steps.empty())
    throw UserError({arg, 0, 0}, "no checkpoint in " + ckpt,
                    "pass a run directory that has written a checkpoint, or a checkpoint .h5 file");
  std::string name = read_latest(ckpt);
  if (name.empty() || !fs::exists(fs::path(ckpt) / name)) name = checkpoint_file_name(steps.back());
  std::vector<std::string> all;
  for (int64_t s : steps) all.push_back(std::to_string(s));
  std::cout << fmt::format("{}: checkpoints at step{} {}; inspecting the latest, {}\n", ckpt, steps.size() > 1 ? "s" : "",
                           fmt::join(all, ", "), name);
  return (fs::path(ckpt) / name).string();
}

class InspectCommand final : public Command {
 public:
  explicit InspectCommand(CLI::App& app) {
    sub_ = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
    sub_->add_option("checkpoint", ckpt_path_, "checkpoint .h5 file, or a run directory (its latest checkpoint)")->required();
  }

  int run(std::optional<Launch>&) override {
    bool ok = false;
    const std::string path = choose_checkpoint(ckpt_path_);
    std::cout << inspect_checkpoint_isolated(path, &ok);  // a crash in HDF5 is a corrupt file
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
