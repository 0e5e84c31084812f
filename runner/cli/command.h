// The commands of the `runner` command line, one file each under runner/cli/; main.cpp builds
// the parser from them, in the order `runner --help` lists them, and runs the one named.
//
// A command declares its CLI11 subcommand and options when it is made (the values they fill
// are its own members) and runs once the command line is parsed. What it needs before it runs
// (MPI for the job's ranks, signal handlers) it says through start(), so main sets it up in
// one place, and every user error still ends in main as `file:line:col: what; how to fix` with
// exit code 2.
#pragma once
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>

#include "runner/train/mpi_job.h"

namespace runner::cli {

// What main sets up before a command runs.
enum class Start {
  plain,              // one process
  ranks,              // the job's ranks: signal handlers, then MPI under mpirun/srun (train, resume)
  ranks_if_launched,  // MPI only when started under mpirun/srun (generate over the recipe's tp layout)
  isolated,           // nothing: no MPI, no checkpoint verifier, no error printing (a child process)
};

class Command {
 public:
  virtual ~Command() = default;
  // Whether the command line named this command.
  virtual bool chosen() const { return sub_->parsed(); }
  virtual Start start() const { return Start::plain; }
  // Runs the parsed command and returns the exit code. `launch` holds the job's processes when
  // start() asked for them. A user error throws UserError.
  virtual int run(std::optional<Launch>& launch) = 0;

 protected:
  CLI::App* sub_ = nullptr;
};

// Each adds its subcommand to `app`; main calls them in this order (the help's order).
std::unique_ptr<Command> plan_command(CLI::App& app);               // cmd_plan.cpp
std::unique_ptr<Command> calibrate_command(CLI::App& app);          // cmd_calibrate.cpp
std::unique_ptr<Command> train_command(CLI::App& app);              // cmd_train.cpp
std::unique_ptr<Command> resume_command(CLI::App& app);             // cmd_train.cpp
std::unique_ptr<Command> inspect_command(CLI::App& app);            // cmd_inspect.cpp
std::unique_ptr<Command> verify_checkpoint_command(CLI::App& app);  // cmd_inspect.cpp (hidden)
std::unique_ptr<Command> data_command(CLI::App& app);               // cmd_data.cpp
std::unique_ptr<Command> tokenizer_command(CLI::App& app);          // cmd_tokenizer.cpp (under data)
std::unique_ptr<Command> report_command(CLI::App& app);             // cmd_report.cpp
std::unique_ptr<Command> export_command(CLI::App& app);             // cmd_export.cpp
std::unique_ptr<Command> import_command(CLI::App& app);             // cmd_import.cpp
std::unique_ptr<Command> generate_command(CLI::App& app);           // cmd_generate.cpp
std::unique_ptr<Command> launch_command(CLI::App& app);             // cmd_launch.cpp
std::unique_ptr<Command> status_command(CLI::App& app);             // cmd_launch.cpp
std::unique_ptr<Command> restart_check_command(CLI::App& app);      // cmd_launch.cpp (hidden)

}  // namespace runner::cli
